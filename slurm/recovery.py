"""The batch shell's recovery: the heartbeat watchdog, the failed step's record and the bounded restart.

What the batch shell (outside any container, on the first node) does besides continuation
(:mod:`vdkit.slurm.render`), with the numbers of :mod:`vdkit.run.faults`:

- **Watchdog** (:func:`watchdog_lines`, a background function while the step runs, for engines whose
  ranks write heartbeats): a rank whose heartbeat is older than ``DEAD_AFTER_S`` (``cluster.heartbeat_timeout_s``) (a dead node, a
  SIGSTOPped process) or no rank's progress for the hang limit (``HANG_FACTOR`` x the slowest measured
  step, the start-up grace before the first step, the save grace during a save) kills the step
  (``scancel --signal=KILL`` of its steps) and leaves the reason and the culprit for the record.
- **Record and restart** (:func:`failure_lines`): a step that ends neither finished (0) nor stopped (75)
  becomes one JSON line in ``faults.jsonl``: the failing rank, its node and signal or exit code (from
  the watchdog, else from srun's own ``srun: error: NODE: task N: Killed`` line), the last checkpoint's
  step and the command that continues. While fewer than ``cluster.max_restarts`` restarts were used and
  the cause is not the recipe's (a rank's exit 2), the next allocation is submitted at once
  (``--dependency=afterany``): it resumes from the last good checkpoint (the engines verify it), without
  any node a dead rank was blamed on (``--exclude``, from ``excluded_nodes``).
- **Submitting the successor** (:func:`submit_lines`) retries with back-off while the controller is away.
- **The hand-over** (:func:`handover_lines`): Slurm counts a job as ended, and starts its ``afterany``
  successor, when the batch shell exits; a process of that job that inherited the lock may still hold it
  (slurmstepd ends it a moment later, or a process left the job's process group). A successor the run
  chained after the lock's holder waits for it (``Limits.handover_wait_s``), and if it is still held then,
  that is the successor's own failure to start: recorded and restarted like any fault (bounded by
  ``cluster.max_restarts``), or the run stops with the record saying why and how to continue. Any other
  job that finds the lock held (a second ``sbatch``) is refused at once.

Why a new allocation rather than srun again inside this one: the allocation holds exactly
``cluster.nodes`` nodes, so a dead node cannot be left out of it, and a node that Slurm has not yet
declared down would take the retried step again. nvidia-resiliency-ext's in-job restart needs its
``ft_launcher`` as each node's process manager (ranks as its children); the kit's ranks are srun's tasks,
one per GPU, and NeMo / Bridge jobs run under Lightning / their own loop - so Slurm's own mechanisms
(step kill, ``--exclude``, dependencies) carry the recovery for every engine alike.
"""
from __future__ import annotations

import shlex
from typing import List

from vdkit.run import faults
from vdkit.run.jobspec import EXIT_REFUSED

# Words for a rank's exit code in the record (others: "exited with code N").
EXIT_WORDS = {EXIT_REFUSED: f"refused its input (exit {EXIT_REFUSED}: the recipe's fault, not restarted)",
              faults.EXIT_NO_SPACE: f"could not write its checkpoint (exit {faults.EXIT_NO_SPACE}: no space or "
                                    "not writable)",
              1: "failed (exit 1: a Python error; see the job's .err)"}


def env_lines(run_dir, limits: faults.Limits) -> List[str]:
    """Exports for the ranks: where to beat, the process group's timeout."""
    from vdkit.run.rundir import HEARTBEAT_DIR

    hb = shlex.quote(f"{run_dir}/{HEARTBEAT_DIR}")
    return [f"export {faults.HEARTBEAT_ENV}={hb}  # each rank's liveness and progress (vdkit.run.faults)",
            f"export {faults.COLLECTIVE_TIMEOUT_ENV}={limits.collective_timeout_s}  # process-group timeout (s), "
            "from the plan: longer than the watchdog's limits",
            f'mkdir -p "${faults.HEARTBEAT_ENV}"; rm -f "${faults.HEARTBEAT_ENV}"/rank* '
            f'"${faults.HEARTBEAT_ENV}"/.why "${faults.HEARTBEAT_ENV}"/.culprit  # this job\'s beats only']


def watchdog_lines(world: int, limits: faults.Limits) -> List[str]:
    """``vdkit_watchdog``: the background check of every rank's heartbeat (see the module docstring)."""
    hb = f'"${faults.HEARTBEAT_ENV}"'
    return [
        "vdkit_watchdog() {  # kill the step when a rank stops beating or no rank progresses (vdkit.run.faults)",
        "  local started now f beat prog step ms node phase compute n newest slowest limit why starting saving oldest who",
        "  started=$(date +%s)",
        f"  while sleep {faults.HEARTBEAT_S}; do",
        "    now=$(date +%s); n=0; newest=0; slowest=0; why=; starting=; saving=; oldest=; who=",
        f"    for f in {hb}/rank*; do",
        '      [ -e "$f" ] || continue',
        '      read -r beat prog step ms node phase compute < "$f" || continue',  # the 7th field (compute ms) is vdkit status's
        '      case "$beat$prog$step$ms" in ""|*[!0-9]*) continue ;; esac',
        "      n=$((n + 1))",
        "      # a rank that left Python says 'exit'; of the silent others the first to stop is the culprit",
        '      if [ "$phase" != exit ] && { [ -z "$oldest" ] || [ "$beat" -lt "$oldest" ]; }; then',
        '        oldest=$beat; who="${f##*/rank} $node"',
        "      fi",
        '      [ "$prog" -gt "$newest" ] && newest=$prog',
        '      [ "$ms" -gt "$slowest" ] && slowest=$ms',
        '      case "$phase" in start) starting=1 ;; save) saving=1 ;; esac',
        "    done",
        f'    if [ -n "$oldest" ] && [ $((now - oldest)) -gt {limits.dead_after_s} ]; then',
        '      why="stopped responding (no heartbeat for $((now - oldest)) s: a dead node or a stopped process)"',
        f'      echo "$who" > {hb}/.culprit',
        "    fi",
        '    if [ -z "$why" ]; then',
        f'      if [ "$n" -lt {world} ]; then',
        f'        [ $((now - started)) -gt {limits.startup_grace_s} ] && '
        f'why="only $n of {world} ranks started within {limits.startup_grace_s} s"',
        "      else",
        f"        limit=$(( {faults.HANG_FACTOR} * slowest / 1000 )); [ \"$limit\" -lt {faults.HANG_MIN_S} ] && "
        f"limit={faults.HANG_MIN_S}",
        f'        [ -n "$saving" ] && [ "$limit" -lt {limits.save_grace_s} ] && limit={limits.save_grace_s}',
        f'        [ -n "$starting" ] && [ "$limit" -lt {limits.startup_grace_s} ] && limit={limits.startup_grace_s}',
        '        [ $((now - newest)) -gt "$limit" ] && why="no rank progressed for $((now - newest)) s '
        '(limit $limit s; a hang) after step $step"',
        "      fi",
        "    fi",
        '    [ -n "$why" ] || continue',
        f'    echo "$why" > {hb}/.why',
        f'    echo "vdkit: watchdog: $(sed \'s/^\\(.*\\) \\(.*\\)$/rank \\1 on \\2: /\' {hb}/.culprit 2>/dev/null)$why; '
        'killing the job step" >&2',
        '    for s in $(squeue -h -s -j "$SLURM_JOB_ID" -o %i 2>/dev/null); do',
        '      case "$s" in *.batch|*.extern) ;; *) scancel --signal=KILL "$s" 2>/dev/null || true ;; esac',
        "    done",
        f'    sleep {limits.kill_grace_s}; kill -KILL "$STEP_PID" 2>/dev/null || true  # srun itself, should a dead '
        'node keep it waiting',
        "    return 0",
        "  done",
        "}",
    ]


def submit_lines(run_dir, limits: faults.Limits) -> List[str]:
    """``vdkit_submit_next``: sbatch the next allocation (``--exclude`` the blamed nodes), with back-off."""
    from vdkit.run.rundir import EXCLUDED_NODES_FILE, JOB_ID_FILE, SBATCH_FILE

    run = shlex.quote(str(run_dir))
    return [
        "vdkit_submit_next() {  # sets NEXT; retries while the controller is away (back-off 5 s .. 60 s)",
        "  # $1 'later': no dependency on this job (a dead node keeps it COMPLETING until Slurm declares the node",
        f"  # down), a start {limits.restart_delay_s} s from now instead, when this shell and its lock are long gone",
        '  [ -n "${NEXT:-}" ] && return 0  # submitted already (at the time limit\'s TERM: vdkit_on_term)',
        '  local delay=5 try out err excl= after="--dependency=afterany:$SLURM_JOB_ID"',
        f'  [ "${{1:-}}" = later ] && after="--begin=now+{limits.restart_delay_s}"',
        f'  [ -s {run}/{EXCLUDED_NODES_FILE} ] && excl="--exclude=$(sort -u {run}/{EXCLUDED_NODES_FILE} | paste -sd, -)"',
        '  err=$(mktemp); NEXT=',
        f"  for try in $(seq 1 {faults.SUBMIT_TRIES}); do",
        f'    if out=$(sbatch --parsable $excl "$after" {run}/{SBATCH_FILE} 2>"$err"); then',
        f'      NEXT=${{out%%;*}}; echo "$NEXT" >> {run}/{JOB_ID_FILE}; rm -f "$err"; return 0',
        "    fi",
        f'    echo "vdkit: submitting the next allocation failed (try $try of {faults.SUBMIT_TRIES}: '
        '$(tail -n1 "$err")); again in $delay s" >&2',
        f'    [ "$try" -lt {faults.SUBMIT_TRIES} ] && sleep "$delay"',
        "    delay=$((delay * 2)); [ $delay -gt 60 ] && delay=60",
        "  done",
        '  rm -f "$err"; return 1',
        "}",
    ]


def handover_lines(run_dir, limits: faults.Limits) -> List[str]:
    """``vdkit_handover``: the run dir's lock is held; 0 once this successor has it, 1 to refuse at once.

    The holder (the lock file's ``slurm P``) is this job's predecessor when ``P`` precedes this job in
    ``job_id.txt`` and either a fault record names this job as the next of a failed job (the restart chain)
    or Slurm no longer runs ``P`` (a stop's or the time limit's hand-over: ``afterany`` starts this job only
    after P). A second submit while ``P`` runs is neither. After ``handover_wait_s`` the successor records
    its failure to start (``vdkit_failed``: restarted while restarts are left) and exits 1."""
    from vdkit.run.rundir import FAULTS_FILE, JOB_ID_FILE, LOCK_FILE
    from vdkit.run.runlock import LOCK_FD

    run = shlex.quote(str(run_dir))
    wait = limits.handover_wait_s
    return [
        "vdkit_handover() {  # the run dir's lock is held: wait for the predecessor's last processes, or refuse",
        f'  local prev; prev=$(cat {run}/{LOCK_FILE} 2>/dev/null || true); prev=${{prev#slurm }}',
        '  case "$prev" in ""|*[!0-9]*) return 1 ;; esac',
        '  [ "$prev" != "$SLURM_JOB_ID" ] || return 1',
        rf'  sed -n "/^$prev\$/,\$p" {run}/{JOB_ID_FILE} 2>/dev/null | grep -qx "$SLURM_JOB_ID" || return 1  # after it',
        # bash sees "\"next\": \"$SLURM_JOB_ID\"": the record's JSON field, quotes and all
        f'  if ! grep -qsF "\\"next\\": \\"$SLURM_JOB_ID\\"" {run}/{FAULTS_FILE}; then  # not a restart: has P ended?',
        '    case "$(squeue -h -j "$prev" -o %T 2>/dev/null || true)" in',
        "      *RUNNING*|*PENDING*|*SUSPENDED*|*CONFIGURING*|*RESIZING*|*REQUEUE*) return 1 ;;",
        "    esac",
        "  fi",
        f'  echo "vdkit: job $prev has ended but its last processes still hold the run directory; job $SLURM_JOB_ID '
        f'waits up to {wait} s for them" >&2',
        f"  flock -w {wait} {LOCK_FD} && return 0",
        f'  vdkit_failed 1 "job $SLURM_JOB_ID did not start: the run directory was still held by processes of job '
        f'$prev {wait} s after it ended"',
        "  exit 1",
        "}",
    ]


def term_lines(run_dir) -> List[str]:
    """``vdkit_on_term``: at the time limit, submit the successor from the TERM trap, before the ranks stop.

    Slurm kills every process of the job ``KillWait`` seconds after its TERM (30 s by default), the batch
    shell included: a shell that waited for the ranks to stop (a step, a checkpoint, the interpreter's exit)
    before it ran sbatch could be killed first, and the run would wait for a person. So the successor is
    submitted at once (``afterany``: it starts when this job has ended, from the last good checkpoint);
    a TERM that is a cancel (slurmstepd's line without "DUE TO TIME LIMIT", written before its TERM) is not."""
    run = shlex.quote(str(run_dir))
    return [
        "vdkit_on_term() {  # Slurm's TERM: at the time limit hand over now (everything is KILLed KillWait s later)",
        rf'  grep -qsE "\*\*\* JOB $SLURM_JOB_ID ON [^ ]+ CANCELLED AT [^ ]+ DUE TO TIME LIMIT \*\*\*" '
        f'{run}/slurm-"$SLURM_JOB_ID".err {run}/slurm-"$SLURM_JOB_ID".out || return 0',
        '  [ -z "${NEXT:-}" ] || return 0',
        '  if vdkit_submit_next; then',
        '    echo "vdkit: at the time limit: job $NEXT continues the run after job $SLURM_JOB_ID, from the '
        'checkpoint the ranks leave (else the last good one)" >&2',
        "  fi",
        "}",
    ]


def last_step_lines(ckpt_dir) -> List[str]:
    """``vdkit_last_step``: the step of the newest complete checkpoint in ``ckpt_dir``, in every engine's naming.

    ``step=N.ckpt`` (reference, megatron: published by a rename); Megatron-Bridge's ``iter_NNNNNNN`` holding
    ``run_config.yaml``, the last file its save writes, after the tracker (megatron/bridge/training/
    checkpointing.py, save_checkpoint's train_state_finalize_fn); NeMo 1.23's ``NAME--...-step=N-...[.ckpt]``
    (Lightning's ModelCheckpoint filename with ``{step}``; a directory for distributed checkpoints) unless NeMo's
    ``...-unfinished`` marker is beside it (nemo/utils/callbacks/nemo_model_checkpoint.py). Sums, set-aside
    (``.damaged-``) and hidden (in-progress) names are skipped."""
    ckpt = shlex.quote(str(ckpt_dir))
    return [
        "vdkit_last_step() {  # the newest complete checkpoint's step, or nothing",
        "  local f n best=",
        f"  for f in {ckpt}/*; do",
        '    n=${f##*/}',
        '    case "$n" in',
        '      *.sha256|*-unfinished|*.damaged-*) continue ;;',
        '      step=*.ckpt) n=${n#step=}; n=${n%.ckpt} ;;',
        '      iter_*) [ -e "$f/run_config.yaml" ] || continue; n=${n#iter_} ;;',
        '      *step=*) [ -e "${f%.ckpt}-unfinished" ] && continue; n=${n##*step=}; n=${n%%[!0-9]*} ;;',
        "      *) continue ;;",
        "    esac",
        '    case "$n" in ""|*[!0-9]*) continue ;; esac',
        '    n=$((10#$n)); { [ -z "$best" ] || [ "$n" -gt "$best" ]; } && best=$n',
        "  done",
        '  echo "$best"',
        "}",
    ]


def failure_lines(run_dir, ckpt_dir, max_restarts: int, echo) -> List[str]:
    """``vdkit_failed RC``: record the failed step, restart from the last good checkpoint while allowed."""
    from vdkit.run.rundir import EXCLUDED_NODES_FILE, FAULTS_FILE, SBATCH_FILE

    run = shlex.quote(str(run_dir))
    ckpt = shlex.quote(str(ckpt_dir))
    hb = f'"${faults.HEARTBEAT_ENV}"'
    again = f"sbatch {echo(run_dir)}/{SBATCH_FILE}"
    codes = " ".join(f'{code}) cause="{words}" ;;' for code, words in EXIT_WORDS.items())
    return last_step_lines(ckpt_dir) + [
        "vdkit_failed() {  # $1: the step's exit code, $2: the cause when the shell knows it, $3 'recipe': the recipe's "
        "fault (the pre-flight). Record; restart",
        '  local rc=$1 cause= rank= node= line= code= last= used restart=0 why= retry=1 exclude=',
        '  if [ -n "${2:-}" ]; then',
        '    cause=$2',
        f'  elif [ -s {hb}/.why ]; then',
        f'    cause=$(cat {hb}/.why)',
        f'    [ -s {hb}/.culprit ] && read -r rank node < {hb}/.culprit',
        f'    [ -n "$node" ] && echo "$node" >> {run}/{EXCLUDED_NODES_FILE} && exclude=1',
        "  else  # srun names the first task that failed: 'srun: error: NODE: task N: Killed'",
        '    line=$(grep -h -m1 -E "^srun: error: [^ :]+: tasks? [0-9]+" '
        f'{run}/slurm-"$SLURM_JOB_ID".err {run}/slurm-"$SLURM_JOB_ID".out 2>/dev/null | sed -n 1p || true)',
        '    if [ -n "$line" ]; then',
        '      node=${line#srun: error: }; node=${node%%:*}',
        "      rank=$(echo \"$line\" | sed -n 's/.*: tasks\\{0,1\\} \\([0-9]*\\).*/\\1/p')",
        '      case "$line" in',
        '        *": Killed"*) cause="killed (SIGKILL: out of memory?)" ;;',
        '        *": Terminated"*) cause="terminated (SIGTERM)" ;;',
        '        *"Segmentation fault"*) cause="crashed (SIGSEGV)" ;;',
        '        *"Aborted"*) cause="aborted (SIGABRT)" ;;',
        "        *\"Exited with exit code\"*) code=$(echo \"$line\" | sed -n 's/.*exit code \\([0-9]*\\).*/\\1/p')",
        f'          case "$code" in {codes} *) cause="exited with code $code" ;; esac ;;',
        '        *) cause="${line#*: task* }" ;;',
        "      esac",
        '      grep -qsE "Node failure on" '
        f'{run}/slurm-"$SLURM_JOB_ID".err && echo "$node" >> {run}/{EXCLUDED_NODES_FILE} && exclude=1',
        "    fi",
        "  fi",
        '  [ -n "$cause" ] || cause="the step failed (exit $rc)"',
        f'  {{ [ "$code" = {EXIT_REFUSED} ] || [ "${{3:-}}" = recipe ]; }} && {{ retry=; why="the recipe\'s fault"; }}',
        "  last=$(vdkit_last_step)",
        f'  used=$(grep -c \'"restart": [1-9]\' {run}/{FAULTS_FILE} 2>/dev/null || true); used=${{used:-0}}',
        f'  [ "$used" -ge {max_restarts} ] && [ -n "$retry" ] && {{ retry=; why="{max_restarts} restart(s) used: '
        'cluster.max_restarts"; }',
        '  if [ -n "$retry" ]; then',
        '    restart=$((used + 1))',
        '    [ -n "$exclude" ] && [ -n "${NEXT:-}" ] && { scancel "$NEXT" 2>/dev/null || true; NEXT=; }  # w/o the node',
        "    vdkit_submit_next ${exclude:+later} || { restart=0; why=\"the next allocation could not be submitted\"; }",
        '  elif [ -n "${NEXT:-}" ]; then  # submitted at the time limit (vdkit_on_term), but no restart is allowed',
        '    scancel "$NEXT" 2>/dev/null || true; NEXT=',
        "  fi",
        f"  printf '{{\"job\": \"%s\", \"rc\": %s, \"rank\": \"%s\", \"node\": \"%s\", \"cause\": \"%s\", "
        f"\"last_step\": \"%s\", \"restart\": %s, \"max_restarts\": {max_restarts}, \"next\": \"%s\", "
        f"\"why\": \"%s\", \"continue\": \"%s\"}}\\n' "
        f'"$SLURM_JOB_ID" "$rc" "$rank" "$node" "${{cause//\\"/}}" "$last" "$restart" "${{NEXT:-}}" "$why" '
        f'"{again}" >> {run}/{FAULTS_FILE}',
        '  local who=; [ -n "$rank" ] && who="rank $rank on $node: "',
        '  if [ "$restart" -gt 0 ]; then',
        f'    echo "vdkit: the job step failed: ${{who}}$cause; restart $restart of {max_restarts}: job ${{NEXT:-}} continues '
        'from the last good checkpoint (step ${last:-0})" >&2',
        "  else",
        f'    echo "vdkit: the job step failed: ${{who}}$cause; not restarted ($why); last checkpoint step '
        f'${{last:-none}}; continue by hand: {again}" >&2',
        "  fi",
        "}",
    ]
