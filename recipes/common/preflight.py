"""The job's pre-flight: before any rank builds a model, every path the job reads is there and of the right kind,
and the checkpoint file system has the room the plan asks. Standard library only, no vdkit import: the run
directory carries this file as ``vdkit_preflight.py`` (``vdkit.run.rundir.PREFLIGHT_SCRIPT``), so it runs on a
cluster node's own ``python3`` or in NVIDIA's stock image as well as in the kit's Python.

    python3 RUN_DIR/vdkit_preflight.py RUN_DIR/preflight.json

``preflight.json`` (``vdkit.run.rundir.PREFLIGHT_FILE``, written at render by :func:`vdkit.render.prepare.preflight_files`) lists
``{"what", "path", "kind"}`` items, the room (``{"path": the checkpoint dir, "gb": the plan's figure}``,
:func:`vdkit.planner.checkpoint_policy.room_gb`) and ``"fabric"`` where the cluster names it: ``socket_ifname`` (this
node must have it, :func:`socket_ifname_problem`) and a multi-node job's ``ib_hcas`` (:func:`ib_hcas_problem`). The first
problem is one line on stderr and exit :data:`EXIT_REFUSED` (2), the recipe's fault for every launcher: never restarted
(:mod:`vdkit.slurm.recovery`, :mod:`vdkit.launch.local`). Exit 0: every check passed.

The kinds (:data:`KINDS`), each what the stack that reads the path needs (a missing file found at the
first step costs the queue wait and the allocation's start-up; a base the stack silently skips trains
random weights - Megatron-Bridge loads ``checkpoint.pretrained_checkpoint`` only where its tracker exists,
megatron/bridge/training/setup.py + training/utils/checkpoint_utils.py ``checkpoint_exists``):

- ``dir``: a readable directory; ``file``: a non-empty regular file (a data file, a tokenizer model);
- ``data_dir``: a directory holding at least one non-empty file;
- ``npy``: a NumPy ``.npy`` whose header parses (NeMo's packed dataset ``np.load``\\ s it);
- ``megatron_checkpoint``: a Megatron / Megatron-Bridge checkpoint directory: its tracker
  (``latest_checkpointed_iteration.txt`` or Bridge's ``latest_train_state.pt``), the iteration directory the
  tracker names (``iter_NNNNNNN`` or ``release``) and in it the distributed checkpoint's ``metadata.json``; where
  torch is importable, every data file as long as torch's ``.metadata`` says (:func:`dcp_short_file`: a cut copy);
- ``nemo``: a ``.nemo`` tar that opens and holds ``model_config.yaml`` (NeMo's SaveRestoreConnector), every member
  whole (a plain tar cut short), or such an extracted directory;
- ``hf``: a Hugging Face model directory: ``config.json`` and weights (``*.safetensors`` / ``*.bin``), each safetensors
  file whole by its header (a cut copy fails every rank's model load) and every shard its index names there;
- ``tokenizer``: a tokenizer file, or a directory holding ``tokenizer.model`` / ``tokenizer.json`` / a vocabulary;
- ``image``: a squashfs container image (pyxis / enroot): the file starts with squashfs' magic ``hsqs``.
"""
import ast
import json
import os
import shutil
import sys
import tarfile

EXIT_REFUSED = 2  # the recipe's fault (vdkit's UserError exit): launchers never restart it
PREFIX = "vdkit pre-flight: "
TRACKERS = ("latest_train_state.pt", "latest_checkpointed_iteration.txt")  # Bridge's and Megatron's (checkpoint_exists)
NPY_MAGIC = b"\x93NUMPY"
SQUASHFS_MAGIC = b"hsqs"
TOKENIZER_FILES = ("tokenizer.model", "tokenizer.json", "vocab.json", "vocab.txt", "tokenizer_config.json")
NEMO_CONFIG = "model_config.yaml"
SAFETENSORS_INDEX = "model.safetensors.index.json"  # a sharded model's tensor -> shard map (transformers)
SAFETENSORS_HEADER_MAX = 100_000_000  # safetensors' own MAX_HEADER_SIZE: a larger length is no header
NEMO_MEMBERS_READ = 10000  # a .nemo holds a handful of members; never walk an unrelated huge tar to the end
DCP_METADATA = ".metadata"  # torch.distributed.checkpoint's index: every data file's name, offsets and lengths
BASE_KINDS = ("megatron_checkpoint", "nemo", "hf")  # a fine-tune's base model as its stack reads it
KINDS = ("dir", "file", "data_dir", "npy", "megatron_checkpoint", "nemo", "hf", "tokenizer", "image")


def _missing(what, path, want):
    if os.path.lexists(path) and not os.path.exists(path):
        return f"{what}={path} is a broken link; {want} was expected there"
    return f"{what}={path} does not exist (not on this node's file systems: a typo, an unmounted file system, " \
           f"or removed since render); {want} was expected there"


def _nonempty_file(path) -> bool:
    try:
        return os.path.isfile(path) and os.path.getsize(path) > 0 and os.access(path, os.R_OK)
    except OSError:
        return False


def _listdir(path):
    try:
        return sorted(os.listdir(path))
    except OSError:
        return None


def _npy_header(path):
    """The parsed header dict of a .npy file, or the reason it does not parse (NumPy's format 1.0 - 3.0)."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(10)
            if len(head) < 10 or head[:6] != NPY_MAGIC:
                return "it is not a NumPy .npy file (no NUMPY magic)"
            major = head[6]
            if major == 1:
                size, start = int.from_bytes(head[8:10], "little"), 10
            elif major in (2, 3):
                head += fh.read(2)
                size, start = int.from_bytes(head[8:12], "little"), 12
            else:
                return f"its .npy format version {major} is unknown"
            fh.seek(start)
            text = fh.read(size)
        if len(text) < size:
            return "its .npy header is cut short"
        header = ast.literal_eval(text.decode("utf-8" if major == 3 else "latin1"))
    except (OSError, ValueError, SyntaxError, UnicodeDecodeError) as exc:
        return f"its .npy header does not parse ({type(exc).__name__})"
    if not isinstance(header, dict) or not {"descr", "fortran_order", "shape"} <= set(header):
        return "its .npy header lacks descr / fortran_order / shape"
    return header


def _dir_problem(names):
    """Why a listing (:func:`_listdir`'s) is no directory to start from: unreadable or empty (None: neither)."""
    return "it is not a readable directory" if names is None else (None if names else "it is empty")


def megatron_checkpoint_problem(path):
    """Why ``path`` is not a Megatron / Megatron-Bridge checkpoint a fine-tune can start from (None: it is)."""
    names = _listdir(path)
    if _dir_problem(names):
        return _dir_problem(names)
    trackers = [t for t in TRACKERS if _nonempty_file(os.path.join(path, t))]
    if not trackers:
        kind = ""
        if "config.json" in names:
            kind = " (it looks like a Hugging Face model: convert it once with import_hf.sbatch)"
        elif os.path.isfile(os.path.join(path, "metadata.json")):
            kind = " (it is one iteration's directory: point at the directory above it)"
        return f"it holds no checkpoint tracker ({' or '.join(TRACKERS)}), so Megatron-Bridge would skip it " \
               f"and train from random weights{kind}"
    iters = [n for n in names if (n.startswith("iter_") or n == "release") and os.path.isdir(os.path.join(path, n))]
    if TRACKERS[1] in trackers:
        try:
            with open(os.path.join(path, TRACKERS[1])) as fh:
                text = fh.read().strip()
            want = "release" if text == "release" else f"iter_{int(text):07d}"
        except (OSError, ValueError):
            return f"its {TRACKERS[1]} does not hold an iteration number"
        if want not in iters:
            return f"its {TRACKERS[1]} names {want}, which is not there"
        iters = [want]
    if not iters:
        return "it holds a tracker but no iter_* directory"
    if not any(_nonempty_file(os.path.join(path, n, "metadata.json")) or
               any(m.startswith("mp_rank_") for m in (_listdir(os.path.join(path, n)) or ())) for n in iters):
        return f"its {iters[-1]} holds no distributed checkpoint (no metadata.json)"
    if os.path.isfile(os.path.join(path, iters[-1], DCP_METADATA)):
        short = dcp_short_file(os.path.join(path, iters[-1]))
        return f"its {iters[-1]}/{short}" if short else None
    return None


def dcp_short_file(path):
    """Which data file of torch.distributed.checkpoint directory ``path`` is shorter than its ``.metadata`` says
    ('__0_0.distcp is cut short (100 of 16384 bytes)', '... is missing', the .metadata unreadable); None when each is
    whole, or without torch here (a node's bare python3): torch's reader judges its format (no checksum is kept)."""
    try:
        from torch.distributed.checkpoint import FileSystemReader
    except ImportError:
        return None
    try:
        storage = FileSystemReader(path).read_metadata().storage_data
    except Exception as exc:  # noqa: BLE001 - any unreadable metadata is a damaged checkpoint
        return f"{DCP_METADATA} is unreadable ({type(exc).__name__}: {exc})"
    need = {}
    for i in (storage or {}).values():
        need[i.relative_path] = max(need.get(i.relative_path, 0), i.offset + i.length)
    for name, size in sorted(need.items()):
        f = os.path.join(path, name)
        have = os.path.getsize(f) if os.path.isfile(f) else -1
        if have < size:
            return f"{name} is {'missing' if have < 0 else f'cut short ({have} of {size} bytes)'}"
    return None


def nemo_problem(path):
    """Why ``path`` is not a .nemo NeMo can restore (None: it is)."""
    if os.path.isdir(path):
        return None if os.path.isfile(os.path.join(path, NEMO_CONFIG)) else f"the directory holds no {NEMO_CONFIG}"
    if not _nonempty_file(path):
        return "it is empty or not a readable file"
    try:
        size, found = os.path.getsize(path), False
        try:  # NeMo writes a plain tar ("w:"): every member's end can be held against the file's, headers only
            with tarfile.open(path, "r:") as tar:
                for n, member in enumerate(tar):
                    if member.isfile() and member.offset_data + member.size > size:
                        return (f"it is cut short: its {member.name} ends at byte {member.offset_data + member.size:,} "
                                f"of a {size:,}-byte file (a copy that did not finish?)")
                    found = found or os.path.basename(member.name) == NEMO_CONFIG
                    if n >= NEMO_MEMBERS_READ:
                        break
        except tarfile.ReadError:  # compressed (NeMo reads r:gz too): the config is all a header walk can tell
            with tarfile.open(path, "r:*") as tar:
                for n, member in enumerate(tar):
                    if os.path.basename(member.name) == NEMO_CONFIG:
                        return None
                    if n >= NEMO_MEMBERS_READ:
                        break
    except (OSError, tarfile.TarError, EOFError) as exc:
        return f"it is not a readable .nemo archive ({type(exc).__name__}: a .nemo is a tar file)"
    return None if found else f"the archive holds no {NEMO_CONFIG}, so it is not a .nemo model"


def safetensors_problem(path):
    """Why the file ``path`` is not a whole safetensors file (None: it is). Reads only its header: the 8-byte length,
    the JSON, and the last tensor's end, which must be the file's (safetensors' ``safe_open`` demands it)."""
    name = os.path.basename(path)
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as fh:
            head = fh.read(8)
            if len(head) < 8:
                return f"its {name} is {size} bytes, shorter than a safetensors header: a copy that did not finish?"
            length = int.from_bytes(head, "little")
            if length > SAFETENSORS_HEADER_MAX or 8 + length > size:
                return f"its {name} is cut short or not safetensors: a {length}-byte header in a {size}-byte file"
            header = json.loads(fh.read(length).decode("utf-8"))
        ends = [int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"]
    except (OSError, ValueError, UnicodeDecodeError, KeyError, TypeError, IndexError, AttributeError) as exc:
        return f"its {name} has no readable safetensors header ({type(exc).__name__})"
    want = 8 + length + max(ends, default=0)
    if want != size:
        return (f"its {name} is {size:,} bytes but its header places tensors up to byte {want:,}: "
                + ("cut short (a copy or download that did not finish?)" if size < want else "bytes its header does not name"))
    return None


def hf_problem(path):
    """Why ``path`` is not a Hugging Face model directory (None: it is): config.json, weights, each safetensors whole."""
    names = _listdir(path)
    if _dir_problem(names):
        return _dir_problem(names)
    if "config.json" not in names:
        return "it holds no config.json (not a Hugging Face model directory)"
    if not any(n.endswith((".safetensors", ".bin")) for n in names):
        return "it holds no weights (*.safetensors or *.bin)"
    if SAFETENSORS_INDEX in names:  # transformers loads every shard its index names
        try:
            with open(os.path.join(path, SAFETENSORS_INDEX)) as fh:
                shards = sorted(set(json.load(fh)["weight_map"].values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            return f"its {SAFETENSORS_INDEX} does not parse ({type(exc).__name__})"
        absent = [n for n in shards if n not in names]
        if absent:
            return f"its {SAFETENSORS_INDEX} names {len(absent)} shard(s) that are not there: {', '.join(absent[:3])}"
    for n in names:
        if n.endswith(".safetensors"):
            why = safetensors_problem(os.path.join(path, n))
            if why:
                return why
    return None


def problem(what, path, kind):
    """One line saying why the job cannot read ``path`` (the recipe key ``what``) as ``kind``; None when it can."""
    if kind not in KINDS:
        raise ValueError(f"unknown pre-flight kind {kind!r}")
    want = {"dir": "a directory", "file": "a non-empty file", "data_dir": "a data directory", "npy": "a .npy file",
            "megatron_checkpoint": "a Megatron-Bridge checkpoint directory", "nemo": "a .nemo model",
            "hf": "a Hugging Face model directory", "tokenizer": "a tokenizer", "image": "a squashfs image"}[kind]
    if not path:
        return f"{what} is not set; {want} was expected"
    if not os.path.exists(path):
        return _missing(what, path, want)
    why = None
    if kind in ("dir", "data_dir", "megatron_checkpoint", "hf") and not os.path.isdir(path):
        why = "it is not a directory"
    elif kind in ("file", "npy", "image") and not _nonempty_file(path):
        why = "it is empty or not a readable file"
    elif kind == "dir":
        why = None if _listdir(path) is not None else "it is not readable"
    elif kind == "data_dir":
        names = _listdir(path)
        if names is None:
            why = "it is not readable"
        elif not any(_nonempty_file(os.path.join(path, n)) or os.path.isdir(os.path.join(path, n)) for n in names):
            why = "it holds no non-empty file"
    elif kind == "npy":
        header = _npy_header(path)
        why = header if isinstance(header, str) else None
    elif kind == "megatron_checkpoint":
        why = megatron_checkpoint_problem(path)
    elif kind == "nemo":
        why = nemo_problem(path)
    elif kind == "hf":
        why = hf_problem(path)
    elif kind == "tokenizer":
        if os.path.isdir(path):
            names = _listdir(path) or []
            why = None if any(_nonempty_file(os.path.join(path, n)) for n in names if n in TOKENIZER_FILES) else \
                f"it holds none of {', '.join(TOKENIZER_FILES)}"
        elif not _nonempty_file(path):
            why = "it is empty or not a readable file"
    elif kind == "image":
        try:
            with open(path, "rb") as fh:
                why = None if fh.read(4) == SQUASHFS_MAGIC else "it is not a squashfs image (no hsqs magic)"
        except OSError as exc:
            why = f"it cannot be read ({exc.strerror})"
    return None if why is None else f"{what}={path}: {why}; {want} was expected"


def _held_bytes(path) -> int:
    """Bytes already under ``path`` (a resumed run's own checkpoints count toward its room)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


def room_problem(path, gb):
    """Why the file system of ``path`` (the checkpoint dir, made by the job if absent) lacks ``gb`` GB of room for
    the plan's checkpoints (None: it has it). What the run already holds there counts as room."""
    if not path or not gb or gb <= 0:
        return None
    probe = os.path.abspath(path)
    while not os.path.exists(probe) and os.path.dirname(probe) != probe:
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe):
        return f"checkpoints go to {path}, but {probe} is not a directory"
    if not os.access(probe, os.W_OK):
        return f"checkpoints go to {path}, but {probe} is not writable"
    free = shutil.disk_usage(probe).free
    held = _held_bytes(path) if os.path.isdir(path) else 0
    if free + held < gb * 1e9:
        return (f"checkpoints go to {path}: {free / 1e9:,.2f} GB free there (+ {held / 1e9:,.2f} GB this run holds), "
                f"the plan needs {gb:,.2f} GB (the checkpoints it keeps plus the one being written)")
    return None


def socket_ifname_problem(ifname, net_dir="/sys/class/net"):
    """Why this node cannot bootstrap over ``ifname`` (``cluster.socket_ifname``: NCCL_ / GLOO_SOCKET_IFNAME; None: it
    can, or cannot be told). Gloo takes exact names: one the node lacks stops every rank at its rendezvous (a
    traceback, restarted as a crash). NCCL's exclusion form (``^docker``) is not checked."""
    if not ifname or str(ifname).startswith("^") or not os.path.isdir(net_dir):
        return None
    have = sorted(_listdir(net_dir) or [])
    missing = [n for n in str(ifname).lstrip("=").split(",") if n and n not in have]
    if not missing or not have:
        return None
    return (f"cluster.socket_ifname={ifname}: {os.uname().nodename} has no network interface {', '.join(missing)} "
            f"(it has {', '.join(have)}); NCCL and gloo bootstrap over it, so every rank would stop at its rendezvous")


def ib_hcas_problem(hcas, ib_dir="/sys/class/infiniband", gpu_devices=("/dev/nvidia0", "/dev/kfd")):
    """Why this node lacks an adapter of ``hcas`` (``cluster.ib_hcas``, NCCL_IB_HCA's exact list; None: it has each, or
    the node has no GPU device, so no rank runs NCCL here - the local emulated Slurm). NCCL matches the list against
    the node's adapters in silence: some missing, it runs on fewer than the plan counts; all missing, over TCP sockets."""
    if not hcas or not any(os.path.exists(d) for d in gpu_devices):
        return None
    have = sorted(_listdir(ib_dir) or [])
    missing = [str(h) for h in hcas if str(h).split(":")[0] not in have]
    if not missing:
        return None
    how = ("NCCL would fall back to TCP sockets without a word" if len(missing) == len(hcas) else
           f"NCCL would use {len(hcas) - len(missing)} of the {len(hcas)} adapters the plan counts")
    return (f"cluster.ib_hcas lists {', '.join(missing)}, which {os.uname().nodename} lacks (its RDMA adapters: "
            f"{', '.join(have) or 'none'}): {how}")


FIXES = {"megatron_checkpoint": "convert the base once (sbatch import_hf.sbatch in a run dir of this model) or "
                                "point model.megatron_path at the directory holding latest_checkpointed_iteration.txt",
         "nemo": "convert the base once (sbatch import_hf.sbatch) or point model.nemo_path at a .nemo file",
         "hf": "stage the Hugging Face model (docs/cluster-guide.md) or point model.hf_path at it",
         "npy": "pack the data again (vdkit data pack, the command `vdkit render` printed)",
         "image": "import the image once (enroot import -o IMAGE.sqsh docker://...) or set engine.container_image",
         "room": "free space there or point run.results_dir at a file system with room",
         "socket_ifname": "set cluster.socket_ifname to an interface every node has, or render with your site's "
                          "cluster file (vdkit site probe on a compute node reads it from the default route)",
         "ib_hcas": "render with your site's cluster file (vdkit site probe on a compute node lists the active adapters), "
                    "or cluster=xe9680_4nic for configuration 2's four adapters"}
DEFAULT_FIX = "make the path exist on the cluster's shared file system (or re-render with the right one)"


def check(spec):
    """The first problem of a pre-flight spec (the parsed preflight.json) as one line with its fix, or None."""
    for need in spec.get("needs", ()):
        found = problem(need.get("what", "a path"), need.get("path"), need.get("kind", "file"))
        if found:
            return f"{found} (fix: {FIXES.get(need.get('kind'), DEFAULT_FIX)})"
    fabric = spec.get("fabric") or {}
    for key, found in (("socket_ifname", socket_ifname_problem(fabric.get("socket_ifname"))),
                       ("ib_hcas", ib_hcas_problem(fabric.get("ib_hcas")))):
        if found:
            return f"{found} (fix: {FIXES[key]})"
    room = spec.get("room") or {}
    found = room_problem(room.get("path"), room.get("gb"))
    return f"{found} (fix: {FIXES['room']})" if found else None


def base_problem(what, path, kind):
    """A rank's refusal of its fine-tune's base (:data:`BASE_KINDS`): one line with the fix, or None."""
    why = problem(what, str(path) if path else "", kind)
    return None if why is None else f"{why}; no step trained (fix: {FIXES[kind]})"


def bridge_base_refused(cfg):
    """A Megatron-Bridge rank's refusal of its fine-tune's base (``cfg`` its ConfigContainer; one line, or None).
    Bridge trains a full fine-tune from random weights where ``checkpoint.pretrained_checkpoint`` has no tracker
    (training/setup.py ``checkpoint_exists``); PEFT reloads the base on every start; a full fine-tune resuming from
    its own checkpoint (``checkpoint.load``'s tracker past iteration 0) has the base's weights in it."""
    base, peft, load = cfg.checkpoint.pretrained_checkpoint, cfg.peft is not None, cfg.checkpoint.load
    if not peft and base is None:
        return None  # pretraining
    if not peft and load:
        try:
            with open(os.path.join(str(load), TRACKERS[1])) as fh:
                if int(fh.read().strip()) > 0:
                    return None
        except (OSError, ValueError):
            pass
    return base_problem("checkpoint.pretrained_checkpoint", base, "megatron_checkpoint")


def base_only(spec):
    """``spec`` with only its base-model needs (:data:`BASE_KINDS`) and no room check: what a rank checks itself."""
    return {"needs": [n for n in spec.get("needs", ()) if n.get("kind") in BASE_KINDS]}


def main(argv=None) -> int:
    """``python3 vdkit_preflight.py [--base] PREFLIGHT_JSON``: exit 0, or one line and :data:`EXIT_REFUSED`.
    ``--base``: the base model only (a rank of an engine whose ranks run the stack's own script, before it)."""
    args = sys.argv[1:] if argv is None else list(argv)
    base = bool(args) and args[0] == "--base"
    args = args[1:] if base else args
    if len(args) != 1:
        print("usage: python3 vdkit_preflight.py [--base] PREFLIGHT_JSON", file=sys.stderr)
        return EXIT_REFUSED
    try:
        with open(args[0]) as fh:
            spec = json.load(fh)
    except (OSError, ValueError) as exc:
        print(f"{PREFIX}cannot read {args[0]} ({type(exc).__name__}) (fix: render the run dir again)",
              file=sys.stderr, flush=True)
        return EXIT_REFUSED
    if base:  # a rank's own check, before its stack starts: the base only
        found = next(filter(None, (base_problem(n.get("what"), n.get("path"), n["kind"])
                                   for n in base_only(spec)["needs"])), None)
    else:
        found = check(spec)
    if found:
        print(PREFIX + found, file=sys.stderr, flush=True)
        return EXIT_REFUSED
    if base:
        return 0
    print(f"{PREFIX}every input is in place ({len(spec.get('needs', ()))} path(s), room for "
          f"{(spec.get('room') or {}).get('gb') or 0:,.1f} GB of checkpoints)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
