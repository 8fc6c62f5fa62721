#!/usr/bin/python3
"""Checks the deployment files under deploy/ without Docker, Kubernetes or Slurm (the ctest `deploy_validate`).

Parses every YAML file (multi-document for Kubernetes) and cross-checks what must agree between them: the compose
services, volumes and coordinator address; the Kubernetes objects (apiVersion/kind/metadata.name, selectors, volume
and port names, the Indexed Job's size); the embedded run configs, which go through the real strict config loader
(`diloco-launch CONFIG --check-config`); the Dockerfile's RUN/COPY paths; the shell scripts (bash -n, shellcheck if
installed, and a run of the entrypoint and the sbatch script against stub binaries); the systemd units
(`systemd-analyze verify`, skipped where it is not installed); deploy/runtime-packages.sh on a built binary.
Usage: /usr/bin/python3 deploy/validate.py --build-dir build    (exit 0 when every check passes)
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

import yaml

DEPLOY = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(DEPLOY)
failures = []


def check(ok, what):
    print(("ok    " if ok else "FAIL  ") + what)
    if not ok:
        failures.append(what)
    return ok


def skip(what):
    print("skip  " + what)


def rel(path):
    return os.path.relpath(path, REPO)


def run(argv, env=None, **kwargs):
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60, **kwargs)


def load_yaml_files():
    docs = {}
    for root, _, files in os.walk(DEPLOY):
        for name in sorted(files):
            if not name.endswith((".yaml", ".yml")):
                continue
            path = os.path.join(root, name)
            try:
                with open(path) as f:
                    docs[path] = [d for d in yaml.safe_load_all(f) if d is not None]
                check(bool(docs[path]), f"{rel(path)}: parses ({len(docs[path])} document(s))")
            except yaml.YAMLError as e:
                check(False, f"{rel(path)}: YAML error: {e}")
    return docs


def check_config_file(path, build_dir, label=None):
    exe = os.path.join(build_dir, "diloco-launch")
    r = run([exe, path, "--check-config"])
    check(r.returncode == 0 and "config OK" in r.stdout,
          f"{label or rel(path)}: the strict config loader accepts it ({(r.stdout + r.stderr).strip()})")
    with open(path) as f:
        return yaml.safe_load(f)


def host_port(address):
    host, _, port = address.rpartition(":")
    return host, port


def check_compose(compose, config):
    services = compose.get("services", {})
    workers = sorted(s for s in services if s.startswith("worker"))
    check("coordinator" in services and len(workers) == 2,
          f"compose: services coordinator + 2 workers (found {sorted(services)})")
    check(len(workers) == config["workers"]["count"], "compose: as many workers as workers.count of config.yaml")
    _, listen_port = host_port(config["coordinator"]["listen"])
    ids = []
    for name, svc in services.items():
        check(svc.get("image") and svc.get("command"), f"compose: {name} has image and command")
        check("./config.yaml:/etc/diloco/config.yaml:ro" in svc.get("volumes", []),
              f"compose: {name} mounts config.yaml read-only at /etc/diloco/config.yaml")
        check("diloco" in svc.get("networks", []), f"compose: {name} is on the diloco network")
        build = svc.get("build")
        if build:
            dockerfile = os.path.join(DEPLOY, build["context"], build["dockerfile"])
            check(os.path.isfile(dockerfile), f"compose: {name} builds from an existing {rel(dockerfile)}")
        if name in workers:
            env = svc.get("environment", {})
            host, port = host_port(env.get("DILOCO_COORDINATOR", ""))
            check(host == "coordinator" and port == listen_port,
                  f"compose: {name} reaches the coordinator service at coordinator:{listen_port} (has {host}:{port})")
            check(svc.get("command") == ["worker"], f"compose: {name} runs the worker role")
            ids.append(env.get("DILOCO_WORKER_ID"))
    check(len(set(ids)) == len(ids) and all(ids), f"compose: worker ids are set and unique ({ids})")
    coordinator = services.get("coordinator", {})
    volumes = [v for v in coordinator.get("volumes", []) if not v.startswith("./")]
    check(f"checkpoints:{config['run']['output_dir']}" in volumes,
          f"compose: the checkpoints volume holds run.output_dir ({config['run']['output_dir']})")
    check("checkpoints" in (compose.get("volumes") or {}), "compose: volume checkpoints is declared")
    check("diloco" in (compose.get("networks") or {}), "compose: network diloco is declared")
    check(any(p.endswith(f":{listen_port}") for p in coordinator.get("ports", [])),
          f"compose: coordinator publishes port {listen_port}")


def pod_volumes(spec):
    return {v["name"]: v for v in spec.get("volumes", [])}


def check_pod(kind, name, template, claim_names, objects, service_names, listen_port, output_dir):
    spec = template["spec"]
    volumes = pod_volumes(spec)
    sc = spec.get("securityContext", {})
    check(sc.get("runAsNonRoot") is True and sc.get("runAsUser", 0) != 0, f"k8s {kind}/{name}: runs as non-root")
    for c in spec.get("containers", []):
        port_names = {p.get("name") for p in c.get("ports", [])}
        for mount in c.get("volumeMounts", []):
            check(mount["name"] in volumes or mount["name"] in claim_names,
                  f"k8s {kind}/{name}: volumeMount {mount['name']} is declared")
        mounts = {m["mountPath"]: m["name"] for m in c.get("volumeMounts", [])}
        check(mounts.get("/etc/diloco") in volumes and "configMap" in volumes[mounts["/etc/diloco"]],
              f"k8s {kind}/{name}: the ConfigMap is mounted at /etc/diloco")
        check(output_dir in mounts, f"k8s {kind}/{name}: run.output_dir {output_dir} is a volume")
        probe = c.get("readinessProbe", {}).get("tcpSocket", {}).get("port")
        if isinstance(probe, str):
            check(probe in port_names, f"k8s {kind}/{name}: probe port {probe} is a named container port")
        for e in c.get("env", []):
            if e["name"] == "DILOCO_COORDINATOR":
                host, port = host_port(e["value"])
                check(host in service_names and port == listen_port,
                      f"k8s {kind}/{name}: DILOCO_COORDINATOR {e['value']} is a Service and coordinator.listen's port")
    for v in volumes.values():
        if "configMap" in v:
            check(("ConfigMap", v["configMap"]["name"]) in objects, f"k8s {kind}/{name}: ConfigMap exists")
        if "secret" in v:
            check(("Secret", v["secret"]["secretName"]) in objects, f"k8s {kind}/{name}: Secret exists")


def check_k8s(docs, config, build_dir):
    k8s_dir = os.path.join(DEPLOY, "k8s")
    objects = {}
    for path, ds in docs.items():
        if not path.startswith(k8s_dir + os.sep) or path.endswith("kustomization.yaml"):
            continue
        for d in ds:
            ok = isinstance(d, dict) and d.get("apiVersion") and d.get("kind") and (d.get("metadata") or {}).get("name")
            check(bool(ok), f"{rel(path)}: {d.get('kind') if isinstance(d, dict) else d} has apiVersion, kind, "
                            f"metadata.name")
            if ok:
                objects[(d["kind"], d["metadata"]["name"])] = d
    kinds = sorted({k for k, _ in objects})
    check({"ConfigMap", "Secret", "Service", "StatefulSet", "Job"} <= set(kinds), f"k8s: object kinds {kinds}")
    _, listen_port = host_port(config["coordinator"]["listen"])
    output_dir = config["run"]["output_dir"]
    services = {n: o for (k, n), o in objects.items() if k == "Service"}

    for (kind, name), o in objects.items():
        if kind == "ConfigMap":
            text = o["data"]["config.yaml"]
            with open(os.path.join(DEPLOY, "config.yaml")) as f:
                check(text == f.read(), f"k8s ConfigMap/{name}: config.yaml is deploy/config.yaml verbatim")
            with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as tmp:
                tmp.write(text)
            check_config_file(tmp.name, build_dir, f"k8s ConfigMap/{name} config.yaml")
            os.unlink(tmp.name)
        if kind == "StatefulSet":
            spec = o["spec"]
            svc = services.get(spec.get("serviceName"))
            check(svc is not None and svc["spec"].get("clusterIP") == "None",
                  f"k8s StatefulSet/{name}: serviceName {spec.get('serviceName')} is a headless Service")
            labels = spec["template"]["metadata"]["labels"]
            check(spec["selector"]["matchLabels"].items() <= labels.items(),
                  f"k8s StatefulSet/{name}: selector matches the pod labels")
            if svc:
                check(svc["spec"]["selector"].items() <= labels.items(), f"k8s Service/{svc['metadata']['name']}: "
                                                                          "selects the coordinator pods")
                check(any(str(p["port"]) == listen_port for p in svc["spec"]["ports"]),
                      f"k8s Service/{svc['metadata']['name']}: port {listen_port}")
            claims = [c["metadata"]["name"] for c in spec.get("volumeClaimTemplates", [])]
            check(bool(claims), f"k8s StatefulSet/{name}: has a volumeClaimTemplate ({claims})")
            mounts = {m["mountPath"]: m["name"] for c in spec["template"]["spec"]["containers"]
                      for m in c.get("volumeMounts", [])}
            check(mounts.get(output_dir) in claims, f"k8s StatefulSet/{name}: the claim holds {output_dir}")
            check(spec.get("replicas") == 1, f"k8s StatefulSet/{name}: one coordinator")
            check(spec["template"]["spec"]["containers"][0].get("args") == ["coordinator"],
                  f"k8s StatefulSet/{name}: runs the coordinator role")
            check_pod(kind, name, spec["template"], claims, objects, services, listen_port, output_dir)
        if kind == "Job":
            spec = o["spec"]
            check(spec.get("completionMode") == "Indexed", f"k8s Job/{name}: Indexed")
            check(spec.get("completions") == config["workers"]["count"] == spec.get("parallelism"),
                  f"k8s Job/{name}: completions = parallelism = workers.count ({config['workers']['count']})")
            c = spec["template"]["spec"]["containers"][0]
            env = {e["name"]: e for e in c.get("env", [])}
            index = env.get("JOB_INDEX", {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath", "")
            check("job-completion-index" in index and "$(JOB_INDEX)" in env.get("DILOCO_WORKER_ID", {}).get("value", ""),
                  f"k8s Job/{name}: worker id from the completion index")
            check(c.get("args") == ["worker"], f"k8s Job/{name}: runs the worker role")
            check_pod(kind, name, spec["template"], [], objects, services, listen_port, output_dir)

    kustomization = docs.get(os.path.join(k8s_dir, "kustomization.yaml"), [{}])[0]
    listed = set(kustomization.get("resources", []))
    present = {os.path.basename(p) for p in docs if p.startswith(k8s_dir + os.sep)} - {"kustomization.yaml"}
    check(listed == present, f"k8s: kustomization.yaml lists every manifest ({sorted(listed)})")
    if shutil.which("kubectl"):
        r = run(["kubectl", "kustomize", k8s_dir])
        rendered = [d for d in yaml.safe_load_all(r.stdout) if d] if r.returncode == 0 else []
        check(r.returncode == 0 and len(rendered) == len(objects),
              f"k8s: `kubectl kustomize deploy/k8s` renders {len(rendered)} objects offline {r.stderr.strip()}")
    else:
        skip("k8s: kubectl not installed (kustomize render)")


def check_dockerfile(config):
    path = os.path.join(DEPLOY, "Dockerfile")
    with open(path) as f:
        text = f.read()
    # Join continuation lines, drop comments.
    lines = re.sub(r"\\\n", " ", "\n".join(l for l in text.splitlines() if not l.lstrip().startswith("#")))
    instructions = [l.strip() for l in lines.splitlines() if l.strip()]
    froms = [i.split()[1] for i in instructions if i.upper().startswith("FROM ")]
    args = dict(re.findall(r"^ARG (\w+)=(\S+)", lines, re.M))
    bases = [args.get(b[2:-1], b) if b.startswith("${") else b for b in froms]
    check(bases and all(b == "debian:bookworm" for b in bases), f"Dockerfile: every stage is debian:bookworm {bases}")
    runs = [i[4:] for i in instructions if i.upper().startswith("RUN ")]
    check(any(r.split()[0] == "scripts/setup" for r in runs), "Dockerfile: RUN scripts/setup installs the packages")
    for r in runs:
        for ref in re.findall(r"(?<![\w/])((?:scripts|deploy|config|tests)/[\w./-]+)", r):
            check(os.path.exists(os.path.join(REPO, ref)), f"Dockerfile: RUN references {ref}, which exists")
    for i in instructions:
        if not i.upper().startswith("COPY ") or "--from=" in i:
            continue
        sources = [t for t in i.split()[1:-1] if not t.startswith("--")]
        for s in sources:
            check(os.path.exists(os.path.join(REPO, s)), f"Dockerfile: COPY source {s} exists")
    check(re.search(r"^COPY .*tests/data/tinyshakespeare.txt " + re.escape(config["data"]["text"]) + "$", lines,
                    re.M) is not None, f"Dockerfile: data.text {config['data']['text']} is in the image")
    users = [i.split()[1] for i in instructions if i.upper().startswith("USER ")]
    check(users and users[-1].split(":")[0] not in ("0", "root"), f"Dockerfile: runtime user is not root {users}")
    check(any(i.startswith("ENTRYPOINT ") for i in instructions), "Dockerfile: has an ENTRYPOINT")


def write_stub(directory, name):
    path = os.path.join(directory, name)
    with open(path, "w") as f:
        f.write('#!/bin/sh\necho "$(basename "$0") $*"\n')
    os.chmod(path, 0o755)


def check_scripts(build_dir):
    scripts = [os.path.join(DEPLOY, p) for p in
               ("entrypoint.sh", "runtime-packages.sh", "slurm/diloco-worker-cluster.sbatch")]
    for s in scripts:
        check(os.access(s, os.X_OK), f"{rel(s)}: executable")
        r = run(["bash", "-n", s])
        check(r.returncode == 0, f"{rel(s)}: bash -n {r.stderr.strip()}")
        if shutil.which("shellcheck"):
            r = run(["shellcheck", s])
            check(r.returncode == 0, f"{rel(s)}: shellcheck {r.stdout.strip()}")
    if not shutil.which("shellcheck"):
        skip("shellcheck not installed")

    with tempfile.TemporaryDirectory() as tmp:
        bin_dir = os.path.join(tmp, "bin")
        os.mkdir(bin_dir)
        for name in ("diloco-coordinator", "diloco-worker", "diloco-ctl"):
            write_stub(bin_dir, name)
        base = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "DILOCO_BIN": bin_dir}
        entry = scripts[0]
        cases = [
            (["coordinator"], {}, "diloco-coordinator --config /etc/diloco/config.yaml"),
            (["worker"], {"DILOCO_COORDINATOR": "c:50051", "JOB_COMPLETION_INDEX": "1"},
             "diloco-worker --config /etc/diloco/config.yaml --coordinator c:50051 --id worker-1"),
            (["worker", "--set", "a.b=1"], {"DILOCO_COORDINATOR": "c:1", "DILOCO_WORKER_ID": "w", "DILOCO_CONFIG": "x"},
             "diloco-worker --config x --coordinator c:1 --id w --set a.b=1"),
            (["ctl", "status", "--addr", "c:1"], {}, "diloco-ctl status --addr c:1"),
        ]
        for argv, env, expected in cases:
            r = run([entry] + argv, env={**base, **env})
            check(r.returncode == 0 and r.stdout.strip() == expected,
                  f"entrypoint {' '.join(argv)} -> {expected} (got {r.stdout.strip() or r.stderr.strip()})")
        r = run([entry, "worker"], env={**base, "DILOCO_COORDINATOR": "c:1"})
        check(r.returncode != 0, "entrypoint worker without an id fails")
        r = run([entry, "worker"], env={**base, "DILOCO_WORKER_ID": "w"})
        check(r.returncode != 0, "entrypoint worker without DILOCO_COORDINATOR fails")

        sbatch = scripts[2]
        with open(sbatch) as f:
            directives = re.findall(r"^#SBATCH (\S+)", f.read(), re.M)
        check("--nodes=1" in directives and "--ntasks=1" in directives, "sbatch: one node, one task (one worker)")
        env = {**base, "DILOCO_HOME": tmp, "SLURM_JOB_ID": "42", "SLURM_CPUS_PER_TASK": "4", "TMPDIR": tmp,
               "DILOCO_COORDINATOR": "coord:50051"}
        r = run(["bash", sbatch, "--set", "inner.steps=5"], env=env, cwd=tmp)
        expected = (f"diloco-worker --config /etc/diloco/config.yaml --coordinator coord:50051 --id slurm-42 "
                    f"--set run.output_dir={tmp}/diloco-42 --set workers.threads=4 --set inner.steps=5")
        got = r.stdout.strip().splitlines()[-1:] if r.stdout.strip() else [r.stderr.strip()]
        check(r.returncode == 0 and got == [expected], f"sbatch runs: {expected} (got {got})")
        r = run(["bash", sbatch], env={k: v for k, v in env.items() if k != "DILOCO_COORDINATOR"}, cwd=tmp)
        check(r.returncode != 0 and "DILOCO_COORDINATOR" in r.stderr, "sbatch without DILOCO_COORDINATOR fails")

    # Two absolute paths, as in the Dockerfile: ldd then prints a "FILE:" header per file, which is not a library.
    r = run([scripts[1], os.path.join(build_dir, "diloco-launch"), "/bin/sh"])
    packages = r.stdout.split()
    check(r.returncode == 0 and "libc6" in packages and any(p.startswith("libyaml-cpp") for p in packages),
          f"runtime-packages.sh finds the packages of diloco-launch ({len(packages)}: libc6, libyaml-cpp...) "
          f"{r.stderr.strip()}")


def check_systemd():
    units = [os.path.join(DEPLOY, "systemd", u) for u in ("diloco-coordinator.service", "diloco-worker@.service")]
    for u in units:
        with open(u) as f:
            text = f.read()
        exec_start = re.findall(r"^ExecStart=(.*)$", text, re.M)
        check(re.search(r"^Restart=on-failure$", text, re.M) and len(exec_start) == 1 and "--fresh" not in exec_start[0],
              f"{rel(u)}: restarts on failure and resumes from its checkpoint (no --fresh)")
        check(re.search(r"^User=diloco$", text, re.M) is not None, f"{rel(u)}: runs as user diloco")
    check("--id %i" in open(units[1]).read(), "diloco-worker@.service: the instance name is the worker id")
    if not shutil.which("systemd-analyze"):
        skip("systemd-analyze not installed (unit verification)")
        return
    with tempfile.TemporaryDirectory() as tmp:
        # The binaries are not installed here: point ExecStart at stubs so verify checks everything else.
        bin_dir = os.path.join(tmp, "bin")
        os.mkdir(bin_dir)
        for name in ("diloco-coordinator", "diloco-worker"):
            write_stub(bin_dir, name)
        for u in units:
            with open(u) as f, open(os.path.join(tmp, os.path.basename(u)), "w") as out:
                out.write(f.read().replace("/opt/diloco/bin/", bin_dir + "/"))
        for unit in ("diloco-coordinator.service", "diloco-worker@gpu-a.service"):
            r = run(["systemd-analyze", "verify", os.path.join(tmp, unit)])
            output = (r.stdout + r.stderr).strip()
            check(r.returncode == 0 and not output, f"systemd-analyze verify {unit} {output}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build-dir", required=True, help="build directory holding diloco-launch")
    build_dir = os.path.abspath(parser.parse_args().build_dir)
    if not os.access(os.path.join(build_dir, "diloco-launch"), os.X_OK):
        print(f"validate.py: {build_dir}/diloco-launch not found; build it first")
        return 2
    docs = load_yaml_files()
    config = check_config_file(os.path.join(DEPLOY, "config.yaml"), build_dir)
    host, _ = host_port(config["coordinator"]["listen"])
    check(host in ("0.0.0.0", "[::]"), f"config.yaml: coordinator.listen binds all interfaces ({host})")
    check_compose(docs[os.path.join(DEPLOY, "compose.yaml")][0], config)
    check_k8s(docs, config, build_dir)
    check_dockerfile(config)
    check_scripts(build_dir)
    check_systemd()
    print(f"\n{len(failures)} failure(s)" if failures else "\nall deploy checks passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
