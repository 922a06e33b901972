"""Kubernetes manifests (deploy/kubernetes/): rendered for 2 and 4 workers, validated offline, and their policies.

The Indexed Job and its Service are validated with `kubernetes-validate --strict` against Kubernetes 1.31 (the
oldest the manifests support) and 1.37 (the newest it knows); the JobSet, a custom resource that tool has no
schema for, with check-jsonschema against the schema vendored from the pinned JobSet release
(deploy/kubernetes/schemas/). Both tools read only local files. Each pod's TF_CONFIG snippet is run by
sh, with a fake `python` that prints the TF_CONFIG it was given, for every pod index. The exit-code policies
are read the way Kubernetes and JobSet apply them: the first matching rule wins, and JobSet matches the Job's
failure message, whose form Kubernetes fixes (see FAILURE_MESSAGE).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
KUBE = REPO / "deploy" / "kubernetes"
JOB, JOBSET = KUBE / "multi-worker-job.yaml", KUBE / "jobset.yaml"
SCHEMA = KUBE / "schemas" / "jobset-v1alpha2.json"
KUBERNETES_VERSIONS = ("1.31.0", "1.37.0")
# The Job's failure condition message when a podFailurePolicy FailJob rule matched: Kubernetes' wording,
# quoted in JobSet's KEP 262 (keps/262-ConfigurableFailurePolicy), which JobSet's message patterns rely on.
POD = "default/tf-train-worker-0-1-x7k2p"
FAILURE_MESSAGE = (
    f"Container {{container}} for pod {POD} failed with exit code {{code}} matching FailJob rule at index {{index}}"
)
DISRUPTION_MESSAGE = f"Pod {POD} has condition DisruptionTarget matching FailJob rule at index {{index}}"


def tool(name: str) -> str:
    path = Path(sys.executable).parent / name  # the dev extra installs it beside python
    if not path.is_file():
        pytest.skip(f"{name} is not installed (it is in the dev extra: make setup)")
    return str(path)


def render(manifest: Path, workers: int, **environ: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(KUBE / "render.sh"), str(manifest), str(workers)],
        env={"PATH": "/usr/bin:/bin", **environ}, capture_output=True, text=True, timeout=30,
    )  # fmt: skip


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> dict[tuple[str, int], Path]:
    """Both manifests rendered for 2 and 4 workers, as files."""
    out = tmp_path_factory.mktemp("rendered")
    files = {}
    for manifest in (JOB, JOBSET):
        for workers in (2, 4):
            result = render(manifest, workers)
            assert result.returncode == 0, result.stderr
            files[manifest.name, workers] = out / f"{manifest.stem}-{workers}.yaml"
            files[manifest.name, workers].write_text(result.stdout)
    return files


def documents(path: Path) -> dict[str, dict]:
    return {doc["kind"]: doc for doc in yaml.safe_load_all(path.read_text())}


def pod_spec_and_job(manifest: Path) -> tuple[dict, dict]:
    docs = documents(manifest)
    job = docs["Job"]["spec"] if "Job" in docs else docs["JobSet"]["spec"]["replicatedJobs"][0]["template"]["spec"]
    return job["template"]["spec"], job


# --- offline validation ------------------------------------------------------------------------------------


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_the_indexed_job_and_service_pass_kubernetes_validate_strict_for_2_and_4_workers(rendered, version):
    files = [str(rendered[JOB.name, workers]) for workers in (2, 4)]
    result = subprocess.run([tool("kubernetes-validate"), "--strict", "-k", version, *files],
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("passed for resource") == 4, result.stdout  # Service and Job, twice


def test_the_jobset_passes_the_vendored_crd_schema_for_2_and_4_workers(rendered):
    files = [str(rendered[JOBSET.name, workers]) for workers in (2, 4)]
    result = subprocess.run([tool("check-jsonschema"), "--schemafile", str(SCHEMA), *files],
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr


def test_both_validators_refuse_an_unknown_field(tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text(JOB.read_text().replace("  backoffLimit: 6", "  backofLimit: 6"))
    jobset = tmp_path / "jobset.yaml"
    jobset.write_text(JOBSET.read_text().replace("          backoffLimit: 0", "          backofLimit: 0"))
    refused = subprocess.run([tool("kubernetes-validate"), "--strict", str(job)], capture_output=True, text=True)
    assert refused.returncode == 1 and "'backofLimit' was unexpected" in refused.stdout + refused.stderr
    refused = subprocess.run([tool("check-jsonschema"), "--schemafile", str(SCHEMA), str(jobset)],
                             capture_output=True, text=True)  # fmt: skip
    assert refused.returncode == 1 and "'backofLimit' was unexpected" in refused.stdout


def test_the_vendored_schema_is_from_the_jobset_release_the_manifest_installs():
    release = json.loads(SCHEMA.read_text())["x-jobset-release"]
    assert re.fullmatch(r"v\d+\.\d+\.\d+", release)
    assert f"jobset/releases/download/{release}/manifests.yaml" in JOBSET.read_text()
    assert f"kubernetes-sigs/jobset {release} (commit " in json.loads(SCHEMA.read_text())["$comment"]


# --- rendering and every pod's TF_CONFIG ----------------------------------------------------------------------


def container_env(container: dict, labels: dict[str, str]) -> dict[str, str]:
    """The container's environment as Kubernetes gives it: values, and labels through the downward API."""
    env = {}
    for item in container["env"]:
        if "value" in item:
            env[item["name"]] = item["value"]
        else:
            path = item["valueFrom"]["fieldRef"]["fieldPath"]
            env[item["name"]] = labels[re.fullmatch(r"metadata\.labels\['(.+)'\]", path).group(1)]
    return env


def tf_configs(pod: dict, env: dict[str, str], workers: int, tmp_path: Path) -> list[dict]:
    """Each pod index's TF_CONFIG, from the manifest's own shell snippet run by sh."""
    (container,) = pod["containers"]
    assert container["command"] == ["/bin/sh", "-c"]
    script = container["args"][0]
    assert script.rstrip().endswith("exec python -m train fit")
    fake = tmp_path / "python"  # stands for the image's python: prints the TF_CONFIG it was started with
    fake.write_text('#!/bin/sh\nprintf "%s" "$TF_CONFIG"\n')
    fake.chmod(0o755)
    configs = []
    for index in range(workers):
        result = subprocess.run(
            ["sh", "-c", script], env={**env, "PATH": f"{tmp_path}:/usr/bin:/bin", "JOB_COMPLETION_INDEX": str(index)},
            capture_output=True, text=True, timeout=10,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        configs.append(json.loads(result.stdout.strip().splitlines()[-1]))
    return configs


@pytest.mark.parametrize("workers", [2, 4])
def test_the_indexed_job_gives_pod_i_the_tf_config_of_worker_i_at_its_service_name(rendered, workers, tmp_path):
    docs = documents(rendered[JOB.name, workers])
    job, service = docs["Job"], docs["Service"]
    pod = job["spec"]["template"]["spec"]
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == workers
    (container,) = pod["containers"]
    env = container_env(container, {})
    assert env["WORKERS"] == str(workers) and env["JOB_NAME"] == job["metadata"]["name"]
    assert env["WORKER_SERVICE"] == pod["subdomain"] == service["metadata"]["name"]
    assert service["spec"]["selector"] == {"job-name": job["metadata"]["name"]}
    assert service["spec"]["ports"][0]["port"] == container["ports"][0]["containerPort"] == int(env["WORKER_PORT"])
    expected = [f"tf-train-{i}.tf-train-workers:2222" for i in range(workers)]
    for index, config in enumerate(tf_configs(pod, env, workers, tmp_path)):
        assert config == {"cluster": {"worker": expected}, "task": {"type": "worker", "index": index}}


@pytest.mark.parametrize("workers", [2, 4])
def test_the_jobset_gives_pod_i_the_tf_config_of_worker_i_at_its_jobset_hostname(rendered, workers, tmp_path):
    jobset = documents(rendered[JOBSET.name, workers])["JobSet"]
    (replicated,) = jobset["spec"]["replicatedJobs"]
    pod, job = pod_spec_and_job(rendered[JOBSET.name, workers])
    assert replicated["replicas"] == 1 and job["completions"] == job["parallelism"] == workers
    assert jobset["spec"]["network"]["enableDNSHostnames"] and "subdomain" not in jobset["spec"]["network"]
    (container,) = pod["containers"]
    labels = {"jobset.sigs.k8s.io/jobset-name": jobset["metadata"]["name"]}  # what the JobSet controller sets
    env = container_env(container, labels)
    assert env["WORKERS"] == str(workers) and container["ports"][0]["containerPort"] == int(env["WORKER_PORT"])
    # JobSet's names: pod <jobset>-<replicatedJob>-<job index>-<pod index>, subdomain <jobset> by default.
    expected = [f"tf-train-{replicated['name']}-0-{i}.tf-train:2222" for i in range(workers)]
    for index, config in enumerate(tf_configs(pod, env, workers, tmp_path)):
        assert config == {"cluster": {"worker": expected}, "task": {"type": "worker", "index": index}}


def test_render_sets_gpus_per_worker_and_the_image_and_nothing_else():
    result = render(JOBSET, 2, GPUS_PER_WORKER="8", IMAGE="registry.example.com/team/tf-train:gpu")
    assert result.returncode == 0, result.stderr
    changed = [
        (a, b) for a, b in zip(JOBSET.read_text().splitlines(), result.stdout.splitlines(), strict=True) if a != b
    ]
    assert [b.split("#")[0].strip() for _, b in changed] == [
        "image: registry.example.com/team/tf-train:gpu", "nvidia.com/gpu: 8",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("workers", "environ", "start"),
    [
        ("0", {}, "error: WORKERS=0 is not allowed: use a whole number from 1 to 9999"),
        ("2", {"GPUS_PER_WORKER": "all"}, "error: GPUS_PER_WORKER=all is not allowed: use a whole number from 0"),
        ("2", {"IMAGE": "a b"}, "error: IMAGE=a b is not allowed: use an image reference like"),
    ],
)
def test_render_refuses_a_bad_value_in_one_line(workers, environ, start):
    result = subprocess.run(["bash", str(KUBE / "render.sh"), str(JOBSET), workers], capture_output=True, text=True,
                            env={"PATH": "/usr/bin:/bin", **environ})  # fmt: skip
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith(start) and len(result.stderr.splitlines()) == 1


def test_both_manifests_run_the_same_pod_apart_from_how_they_name_the_workers():
    job_pod, _ = pod_spec_and_job(JOB)
    jobset_pod, _ = pod_spec_and_job(JOBSET)
    for pod in (job_pod, jobset_pod):
        pod.pop("subdomain", None)
        (container,) = pod["containers"]
        container.pop("args")
        container["env"] = [
            e for e in container["env"] if e["name"] not in ("JOB_NAME", "WORKER_SERVICE", "JOBSET_NAME")
        ]
    assert job_pod == jobset_pod


# --- what each exit code does ---------------------------------------------------------------------------------


def pod_failure_rule(job: dict, code: int | None, disrupted: bool = False) -> tuple[int, dict] | None:
    """Kubernetes' podFailurePolicy: the first rule matching the container's exit code or the pod's conditions."""
    for index, rule in enumerate(job["podFailurePolicy"]["rules"]):
        codes = rule.get("onExitCodes")
        if codes and codes["containerName"] == "train" and codes["operator"] == "In" and code in codes["values"]:
            return index, rule
        conditions = rule.get("onPodConditions", [])
        if disrupted and any(c["type"] == "DisruptionTarget" and c.get("status", "True") == "True" for c in conditions):
            return index, rule
    return None


def indexed_job_outcome(code: int | None, disrupted: bool = False) -> str:
    _, job = pod_spec_and_job(JOB)
    match = pod_failure_rule(job, code, disrupted)
    action = match[1]["action"] if match else "Count"
    return {"Ignore": "replaced, not counted", "FailJob": "fails", "Count": "replaced, counted"}[action]


def jobset_outcome(code: int | None, disrupted: bool = False) -> str:
    jobset = documents(JOBSET)["JobSet"]["spec"]
    _, job = pod_spec_and_job(JOBSET)
    assert job["backoffLimit"] == 0  # any failure that no FailJob rule takes fails the Job: BackoffLimitExceeded
    match = pod_failure_rule(job, code, disrupted)
    if match is None:
        reason, message = "BackoffLimitExceeded", "Job has reached the specified backoff limit"
    else:
        assert match[1]["action"] == "FailJob"
        reason = "PodFailurePolicy"
        template = DISRUPTION_MESSAGE if code is None else FAILURE_MESSAGE
        message = template.format(container="train", code=code, index=match[0])
    action = "RestartJobSet"  # JobSet's default when no rule matches
    for rule in jobset["failurePolicy"]["rules"]:
        reasons, patterns = rule.get("onJobFailureReasons", []), rule.get("onJobFailureMessagePatterns", [])
        if (not reasons or reason in reasons) and (not patterns or any(re.search(p, message) for p in patterns)):
            action = rule["action"]
            break
    return {
        "RestartJobSetAndIgnoreMaxRestarts": "all restarted, not counted",
        "RestartJobSet": "all restarted, counted",
        "FailJobSet": "fails",
    }[action]


@pytest.mark.parametrize(
    ("code", "disrupted", "outcome"),
    [(42, False, "replaced, not counted"), (75, False, "replaced, not counted"), (2, False, "fails"),
     (1, False, "replaced, counted"), (137, False, "replaced, counted"), (137, True, "replaced, not counted")],
    ids=["stopped-42", "busy-75", "bad-input-2", "failed-1", "killed-137", "evicted"],
)  # fmt: skip
def test_the_indexed_job_replaces_42_and_75_for_free_and_fails_at_once_on_2(code, disrupted, outcome):
    assert indexed_job_outcome(code, disrupted) == outcome


@pytest.mark.parametrize(
    ("code", "disrupted", "outcome"),
    [(42, False, "all restarted, not counted"), (75, False, "all restarted, not counted"), (2, False, "fails"),
     (1, False, "all restarted, counted"), (137, False, "all restarted, counted"),
     (None, True, "all restarted, not counted")],
    ids=["stopped-42", "busy-75", "bad-input-2", "failed-or-peer-hung-1", "killed-137", "evicted"],
)  # fmt: skip
def test_the_jobset_restarts_every_worker_on_42_and_75_for_free_and_fails_at_once_on_2(code, disrupted, outcome):
    assert jobset_outcome(code, disrupted) == outcome


def test_the_jobset_waits_for_the_old_pods_before_starting_new_ones():
    policy = documents(JOBSET)["JobSet"]["spec"]["failurePolicy"]
    assert policy["restartStrategy"] == "BlockingRecreate" and policy["maxRestarts"] > 0


def test_the_grace_period_covers_a_save():
    for manifest in (JOB, JOBSET):
        pod, _ = pod_spec_and_job(manifest)
        assert pod["terminationGracePeriodSeconds"] >= 60 and pod["restartPolicy"] == "Never"


# --- tune-job.yaml: an Indexed Job of `python -m train tune`, one shared storage ------------------------------

TUNE_JOB = KUBE / "tune-job.yaml"


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_the_tune_job_passes_kubernetes_validate_strict_for_2_and_4_pods(tmp_path, version):
    files = []
    for pods in (2, 4):
        result = render(TUNE_JOB, pods)
        assert result.returncode == 0, result.stderr
        files.append(tmp_path / f"tune-{pods}.yaml")
        files[-1].write_text(result.stdout)
        job = documents(files[-1])["Job"]["spec"]
        assert (job["completions"], job["parallelism"], job["completionMode"]) == (pods, pods, "Indexed")
    result = subprocess.run([tool("kubernetes-validate"), "--strict", "-k", version, *map(str, files)],
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("passed for resource") == 2, result.stdout


def test_each_tune_pod_passes_its_index_and_the_shared_storage():
    pod, _ = pod_spec_and_job(TUNE_JOB)
    (container,) = pod["containers"]
    command = container["args"][0]
    assert 'python -m train tune --index "$JOB_COMPLETION_INDEX" --storage "$TUNE_STORAGE"' in command
    env = {each["name"]: each["value"] for each in container["env"]}
    assert env["TUNE_STORAGE"] == f"journal:{env['STUDY_DIR']}/study.journal"
    mounts = {each["mountPath"] for each in container["volumeMounts"]}
    assert any(env["STUDY_DIR"].startswith(path + "/") for path in mounts)  # on the shared volume


@pytest.mark.parametrize(
    ("code", "disrupted", "outcome"),
    [(42, False, "replaced, not counted"), (75, False, "replaced, not counted"), (2, False, "fails"),
     (1, False, "fails"), (137, False, "replaced, counted"), (137, True, "replaced, not counted")],
    ids=["stopped-42", "busy-75", "bad-input-2", "three-failures-1", "killed-137", "evicted"],
)  # fmt: skip
def test_the_tune_job_replaces_42_and_75_for_free_and_fails_at_once_on_1_and_2(code, disrupted, outcome):
    _, job = pod_spec_and_job(TUNE_JOB)
    match = pod_failure_rule(job, code, disrupted)
    action = match[1]["action"] if match else "Count"
    assert {"Ignore": "replaced, not counted", "FailJob": "fails", "Count": "replaced, counted"}[action] == outcome
