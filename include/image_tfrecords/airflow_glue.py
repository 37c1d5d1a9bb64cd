"""Everything the DAGs and the datasets page need from Airflow, in the one module that imports it.

``dags/`` holds the DAGs' wiring only and finds this module through the installed package, so a
deployment needs nothing on ``sys.path`` but ``dags_folder`` (``plugins/`` adds the UI page, no
task needs it). Here: the S3 client from the ``aws_default`` connection (``airflow_storage``), the
run's version and snapshot time, the trigger form's Params and the params-to-``BuildConfig``
mapping (both from ``options.OPTIONS``), ``run_stage``, which
calls a stage and turns its errors into Airflow's outcomes the way the CLI turns them into exit
codes: errors retrying cannot fix fail the task at once, the others are left to Airflow's retries;
and the publish gate's branch and its human-in-the-loop approval (``gate_branch``, ``gate_approval``).

Airflow is imported inside functions only, so the package imports without it (the CLI, readers).
"""

from __future__ import annotations

import errno
import functools
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any

from . import compiled, config, options
from .published import layout
from .storage import Storage

log = logging.getLogger(__name__)

AWS_CONN_ID = "aws_default"
CLIENT_TTL_SECONDS = 300.0
_cache: dict[str, tuple[int, float, Any, Any]] = {}  # conn_id -> (pid, made at, its S3Hook, this process's client)
_lock = threading.Lock()


def _forget_clients() -> None:
    """In a forked child (a task's process pool): drop the parent's clients, keep their hooks.

    A client holds its process's pooled connections, sockets the parent and every other child go on using: two
    processes reading answers off one socket take each other's bytes (issue 48: ``FlexibleChecksumError``s, or
    silently another object's bytes). A hook holds the connection the parent resolved: a child asking Airflow
    for it would talk to the task's supervisor over the socket the parent shares with it, so it must not."""
    global _lock
    for conn_id, (pid, made, hook, _client) in list(_cache.items()):
        _cache[conn_id] = (pid, made, hook, None)
    _lock = threading.Lock()  # the parent's may have been held by one of its threads at the fork


os.register_at_fork(after_in_child=_forget_clients)


def s3_client(conn_id: str = AWS_CONN_ID) -> Any:
    """A boto3 S3 client from the Airflow connection ``conn_id`` (endpoint, credentials, addressing).

    Reused for a few minutes within one process: creating it costs about half a second (boto3 loads
    its service model each time), which adds up when tasks share a process (``airflow dags test``).
    Each task of a real deployment runs in a process of its own, so it sees connection changes. A forked
    child makes a client of its own from the connection its parent resolved (``_forget_clients``): the
    task's process resolves it before it forks its pool, as it reads its inputs first.
    """
    from airflow.providers.amazon.aws.hooks.s3 import S3Hook

    with _lock:
        pid, made, hook, client = _cache.get(conn_id, (0, 0.0, None, None))
        if hook is None or (pid == os.getpid() and time.monotonic() - made > CLIENT_TTL_SECONDS):
            pid, made, hook, client = os.getpid(), time.monotonic(), S3Hook(aws_conn_id=conn_id), None
        if client is None:  # the hook's own client (``get_conn``) may be the parent's: always a new one here
            client = hook.get_client_type(region_name=hook.region_name)
        _cache[conn_id] = (pid, made, hook, client)
        return client


def airflow_storage() -> Storage:
    """A Storage for local paths and ``s3://`` URIs whose S3 client comes from ``aws_default``."""
    return Storage(s3_client)


def run_version(context: Mapping[str, Any]) -> str:
    """The version a run builds: the ``version`` param, else its logical date, else its run id."""
    override = context["params"].get("version")
    if override:
        return override
    logical_date = context.get("logical_date")
    if logical_date is not None:
        return layout.version_name(logical_date)
    return re.sub(r"[^A-Za-z0-9._-]+", "-", context["run_id"]).strip("-.") or "run"


def snapshot_as_of(context: Mapping[str, Any]) -> str | None:
    """The snapshot time of a run: scheduled runs and backfills see the source as of their logical
    date (files modified at or before it); manual runs see everything present when they start."""
    run_type = getattr(context["dag_run"], "run_type", None)
    run_type = str(getattr(run_type, "value", run_type))
    logical_date = context.get("logical_date")
    if run_type in ("scheduled", "backfill") and logical_date is not None:
        return logical_date.in_timezone("UTC").isoformat()
    return None


def notify_failure(context: Mapping[str, Any]) -> None:
    """Failure notice for a task that failed for good (retries exhausted or not retryable).

    Logged at ERROR by default; point it elsewhere by replacing this callback, e.g. with a
    provider notifier such as ``SlackNotifier`` or ``SmtpNotifier`` in the DAG's ``default_args``.
    """
    ti = context["ti"]
    log.error("image_tfrecords FAILED: run %s, task %s (try %s), version %s: %s", context["run_id"], ti.task_id,
              ti.try_number, run_version(context), context.get("exception"))


def dag_params() -> dict[str, Any]:
    """The trigger form's Params, one per option that has one (``options.OPTIONS``: type, bounds, title,
    section, help); a deployment sets the defaults of source, destination and dataset in the environment
    (``IMAGE_TFRECORDS_SOURCE`` ...)."""
    from airflow.sdk import Param

    params = {}
    for option in options.OPTIONS:
        if option.param_name is None:
            continue
        value = option.dag_default()
        if isinstance(value, float) and value.is_integer():
            value = int(value)  # the form shows 100, not 100.0 (and the runs' params stay what they were)
        params[option.param_name] = Param(value, **option.schema(), title=option.title, section=option.section,
                                          description=option.help)
    return params


def build_config(context: Mapping[str, Any]) -> config.BuildConfig:
    """The run's ``BuildConfig``, from its params, version and snapshot time (ConfigError if invalid).

    A nullable option's None (the trigger form sends null for a field left empty) is its default, "not set"."""
    params = context["params"]
    given = {o.name: options.default(o.name) if o.nullable and params[o.param_name] is None else params[o.param_name]
             for o in options.OPTIONS if o.config and o.param_name is not None and o.param_name in params}
    return config.BuildConfig(**given, version=run_version(context), as_of=snapshot_as_of(context))


def run_stage(stage: Callable[..., Any], staging_grace_hours: float = 24.0, **kwargs: Any) -> Any:
    """Call a stage function (``image_tfrecords.stages``) with the current run's config and storage.

    Every task but discard and clean holds the version's lock. Errors retrying cannot fix (bad
    params, bad input, missing bucket, wrong credentials) fail the task at once instead of burning
    retries; retryable ones (an unreachable store, a contended ``latest.json``) are retried.
    """
    from airflow.sdk import get_current_context
    from airflow.sdk.exceptions import AirflowFailException

    from . import stages
    from .errors import ImageTfrecordsError, LockHeld
    from .published import locking
    from .published.cleanup import clean_staging
    from .source.preflight import check_locations, os_error_line

    context = get_current_context()
    params = context["params"]
    try:
        cfg = build_config(context)
        storage = airflow_storage()
        if stage is stages.discover_stage:
            check_locations(cfg)
        if stage is clean_staging:
            report = clean_staging(storage, cfg.dataset_uri, staging_grace_hours * 3600)
            for entry in report:
                log.info("staging %s (%d files, %.1f MB, %.1f h old): %s", entry["uri"], entry["files"],
                         entry["bytes"] / 1e6, entry["age_hours"], entry["action"])
            return {"removed": [e["version"] for e in report if e["action"] == "remove"],
                    "kept": len([e for e in report if e["action"] != "remove"])}
        unlocked = stage is stages.discard_stage  # no lock for discard: the lock dies with the staging prefix
        if not unlocked:
            locking.hold(storage, cfg.staging_uri, _lock_owner(context), locking.DAG_LEASE_SECONDS)
        storage.defer_sync(cfg.staging_uri)  # what the task staged is on disk when it succeeds: one syncfs
        log.info(compiled.line())
        result = stage(cfg, storage, **kwargs)
        if not unlocked:
            storage.sync(cfg.staging_uri)
        return result
    except LockHeld as exc:
        raise AirflowFailException(f"version {run_version(context)} is being built by another run: {exc}") from exc
    except ImageTfrecordsError as exc:
        if exc.retryable:
            raise
        raise AirflowFailException(f"{type(exc).__name__}: {exc}") from exc
    except OSError as exc:  # a read-only or full destination, a full TMPDIR: one line; retried if it may pass
        if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOTDIR, errno.EISDIR):
            raise AirflowFailException(os_error_line(exc, params["destination"])) from exc
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise RuntimeError(os_error_line(exc, params["destination"])) from exc
        raise
    except ImportError as exc:  # a deployment that lacks a package: say what to install, never retry
        raise AirflowFailException(f"{exc}: install the image-tfrecords package with its Airflow extras "
                                   "(pip install 'image-tfrecords[airflow]') where the tasks run") from exc


APPROVE, REJECT = "Approve", "Reject"  # the options a person sees when the publish gate trips
GATE_XCOM = "gate"  # the gate task's XCom key: the approval's subject and body (small: the report's shown lines)


def gate_branch(context: Mapping[str, Any], result: Mapping[str, Any], publish: str, ask: str) -> str:
    """The task after the gate: ``publish`` when it passed (or was accepted), ``ask`` (the approval task) when
    it tripped and the ``approval`` param is set; otherwise the gate task fails, its report in the log."""
    from airflow.sdk.exceptions import AirflowFailException

    from .rules.publish_gate import TRIPPED

    report = "\n".join(result["report"])
    if result["verdict"] != TRIPPED:
        return publish
    version = run_version(context)
    if not context["params"].get("approval"):  # the run ends here: a run with accept_gate may take the staging
        from .published import locking

        locking.release(airflow_storage(), build_config(context).staging_uri, _lock_owner(context))
        raise AirflowFailException(f"{result['report'][0]}: nothing was published (set the approval param to ask a "
                                   f"person, or accept_gate to publish anyway)\n{report}")
    dataset = context["params"]["dataset"]
    context["ti"].xcom_push(key=GATE_XCOM, value={
        "subject": f"Publish {dataset} version {version}? Its publish gate tripped",
        "body": (f"The build of **{dataset}** version **{version}** differs from the previous published version "
                 f"more than the gate's thresholds allow.\n\n**{APPROVE}** publishes it (its manifest records who "
                 f"approved); **{REJECT}** discards it: nothing is published.\n\n```\n{report}\n```")})
    log.info("publish gate tripped: waiting for a person to approve or reject version %s", version)
    return ask


def _lock_owner(context: Mapping[str, Any]) -> str:
    """The owner of the version's lock that a DAG run's tasks hold (``locking``)."""
    return f"airflow:{context['dag'].dag_id}:{context['run_id']}"


def gate_approval(task_id: str, gate_task: str, on_approve: str, on_reject: str, timeout: timedelta) -> Any:
    """The human-in-the-loop task that asks a person, in the Airflow UI's Required Actions, to approve (run
    ``on_approve``) or reject (run ``on_reject``) a build whose gate tripped; the subject and body are the
    ``gate_task``'s. An approval is recorded in the staged manifest (``stages.approve_gate``, with the name of
    who approved) before ``on_approve`` runs. Unanswered after ``timeout``, it counts as a rejection."""
    template = "{{{{ ti.xcom_pull(task_ids='{task}', key='{key}')['{field}'] }}}}"
    return _approval_class()(
        task_id=task_id, options=[APPROVE, REJECT], defaults=[REJECT], response_timeout=timeout,
        options_mapping={APPROVE: on_approve, REJECT: on_reject},
        subject=template.format(task=gate_task, key=GATE_XCOM, field="subject"),
        body=template.format(task=gate_task, key=GATE_XCOM, field="body"))


@functools.cache
def _approval_class() -> type:
    """``HITLBranchOperator`` (the standard provider's) that records an approval in the staged manifest."""
    from airflow.providers.standard.operators.hitl import HITLBranchOperator

    class GateApprovalOperator(HITLBranchOperator):
        """Approve or reject a build whose publish gate tripped (see ``gate_approval``)."""

        def execute_complete(self, context: Any, event: dict[str, Any]) -> Any:
            who = (event.get("responded_by_user") or {}).get("name") or ""
            chosen = event.get("chosen_options") or []
            log.info("publish gate: %s answered %s", who or "nobody (timed out)", ", ".join(chosen))
            if chosen == [APPROVE]:  # before branching: if it fails, the retry asks again and nothing is skipped
                from . import stages

                run_stage(stages.approve_gate, by=who)
            return super().execute_complete(context, event)

    GateApprovalOperator.__module__ = __name__
    return GateApprovalOperator
