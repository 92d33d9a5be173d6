"""Reading user files and writing outputs, with one-line errors.

Reading: `read_text_file` refuses a missing path, a directory, a device or pipe (/dev/zero must
not hang) and a file over MAX_INPUT_FILE_BYTES before reading it, and strips a UTF-8 byte-order
mark. Writing: `write_outputs` is the one place autopar writes a file. Each file goes to a
temporary file in the same folder and is then linked into place (a new file: os.link, which
fails if the name exists, so no two processes both create one) or renamed over the target
(--force: os.replace), all files of a call or none, so a failed or interrupted write leaves
nothing half-written or replaced; an existing target is refused unless `force`, an output that
is an input or another output always; every OSError becomes one line naming the path and the
reason.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path
from typing import Any, Mapping, Sequence

from autopar.errors import InputFileError, OutputFileError
from autopar.limits import MAX_INPUT_FILE_BYTES, check_name, clip

def _reason(exc: OSError) -> str:
    return exc.strerror or exc.__class__.__name__


def read_text_file(path: Path | str, what: str, fix: str, max_bytes: int = MAX_INPUT_FILE_BYTES) -> str:
    """The UTF-8 text of a regular file of at most `max_bytes` (a leading BOM removed).
    `what` names the file in messages ("plan file"); `fix` says how to get a good one when it is missing."""
    check_name(str(path), what)
    p = Path(path)
    try:
        st = p.stat()
    except FileNotFoundError:
        raise InputFileError(f"{what} {clip(p)} does not exist; {fix}") from None
    except OSError as exc:
        raise InputFileError(f"cannot read {what} {clip(p)}: {_reason(exc)}; check the path") from None
    if stat.S_ISDIR(st.st_mode):
        raise InputFileError(f"{what} {clip(p)} is a directory, not a file; pass the file inside it")
    if not stat.S_ISREG(st.st_mode):
        raise InputFileError(f"{what} {clip(p)} is not a regular file (a device, pipe or socket); pass a file")
    if st.st_size > max_bytes:
        raise InputFileError(f"{what} {clip(p)} is {st.st_size / 2**20:,.1f} MiB; autopar reads files up to "
                             f"{max_bytes / 2**20:g} MiB, so pass the right file")
    try:
        with open(p, "rb") as f:
            data = f.read(max_bytes + 1)
    except OSError as exc:
        raise InputFileError(f"cannot read {what} {clip(p)}: {_reason(exc)}; check its permissions") from None
    if len(data) > max_bytes:
        raise InputFileError(f"{what} {clip(p)} is over {max_bytes / 2**20:g} MiB; pass the right file")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InputFileError(f"{what} {clip(p)} is not UTF-8 text (byte {exc.start}); pass a text file") from None


def read_json_object(path: Path, what: str, fix: str) -> dict[str, Any]:
    """The JSON object in `path`. `what` names the file in messages ("plan file"), `fix` says how
    to get a good one when it is missing."""
    text = read_text_file(path, what, fix)
    try:
        raw = json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise InputFileError(f"{what} {clip(path)} is malformed JSON near line {exc.lineno}: {exc.msg}; fix its syntax")
    except ValueError as exc:
        raise InputFileError(f"{what} {clip(path)}: {exc}; use a finite number")
    except RecursionError:
        raise InputFileError(f"{what} {clip(path)} nests too deeply; pass the right file") from None
    if not isinstance(raw, dict):
        raise InputFileError(f"{what} {clip(path)} must hold a JSON object, not {type(raw).__name__}")
    return raw


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


# --------------------------------------------------------------------------- writing


def check_output(path: Path | str, force: bool, what: str = "output", probe: bool = True) -> Path:
    """Refuse, before any work, an output path that exists (unless `force`), is a directory or a
    device, or whose folder is a file or takes no new file. `probe`: a file is created and removed
    in the nearest existing folder, so /proc, a read-only mount or a folder without write permission
    is refused up front (os.access says yes to root for all three). Returns the path."""
    check_name(str(path), what)
    p = Path(path).expanduser()
    try:
        st = p.stat()
    except (FileNotFoundError, NotADirectoryError):
        st = None
    except OSError as exc:
        raise OutputFileError(f"cannot write {what} {clip(p)}: {_reason(exc)}; choose another path") from None
    if st is not None:
        if stat.S_ISDIR(st.st_mode):
            raise OutputFileError(f"{what} {clip(p)} is a directory; give a file path")
        if not stat.S_ISREG(st.st_mode):
            raise OutputFileError(f"{what} {clip(p)} is not a regular file; give a file path")
        if not force:
            raise OutputFileError(f"{what} {clip(p)} exists; pass --force to overwrite it, or choose another path")
    for parent in p.parents:
        if parent.exists():
            if not parent.is_dir():
                raise OutputFileError(f"cannot write {what} {clip(p)}: {clip(parent)} is a file, not a folder")
            if probe:
                _probe(parent, p, what)
            elif not os.access(parent, os.W_OK | os.X_OK):
                raise OutputFileError(f"cannot write {what} {clip(p)}: Permission denied in {clip(parent)}; "
                                      "choose a writable folder")
            break
    return p


def _probe(folder: Path, target: Path, what: str) -> None:
    """Create and remove a file in `folder`; OutputFileError naming `target` when the system refuses."""
    import tempfile

    try:
        fd, tmp = tempfile.mkstemp(prefix=".autopar-probe-", dir=folder)
    except OSError as exc:
        raise OutputFileError(f"cannot write {what} {clip(target)}: {_reason(exc)} in {clip(folder)}; "
                              "choose a writable folder") from None
    os.close(fd)
    _quietly(os.unlink, tmp)


def check_outputs_apart(paths: Sequence[Path | str], inputs: Sequence[Path | str] = (), what: str = "output") -> None:
    """Refuse two outputs that are one file (`--out` and `--plot` alike, a picture and its
    NAME-memory companion) and an output that is one of the command's input files, through a
    symlink or ../ too, even with --force: writing it would replace what autopar read. Inputs
    that are not files (preset names) are skipped."""
    seen: dict[str, Path] = {}
    for p in paths:
        key = _file_key(p)
        if key in seen:
            named = clip(p) if str(seen[key]) == str(p) else f"one file ({clip(seen[key])}, {clip(p)})"
            raise OutputFileError(f"two {what}s are {named}; give each its own path (--plot NAME.png also writes "
                                  "NAME-memory.png)")
        seen[key] = Path(p)
    for source in inputs:
        if not os.path.isfile(os.path.expanduser(source)):
            continue
        for p in paths:
            if _file_key(p) == _file_key(source) or _same_existing(p, source):
                raise OutputFileError(f"{what} {clip(p)} is the input {clip(source)}; writing it would replace what "
                                      "autopar read, so choose another path (--force does not apply)")


def _file_key(path: Path | str) -> str:
    return os.path.normcase(os.path.realpath(os.path.expanduser(path)))


def _same_existing(a: Path | str, b: Path | str) -> bool:
    try:
        return os.path.samefile(os.path.expanduser(a), os.path.expanduser(b))
    except OSError:
        return False


def write_outputs(path_to_data: Mapping[Path | str, str | bytes] | Sequence[tuple[Path | str, str | bytes]], *,
                  force: bool, executable: tuple[str, ...] = (".sh",), what: str = "output",
                  inputs: Sequence[Path | str] = ()) -> list[str]:
    """Write every file or none. Each is staged in a temporary file beside its target, then put in
    place: without `force` linked there (os.link fails when the name exists, so the existence check
    and the creation are one step: two processes cannot both create one file), with `force` renamed
    over it (os.replace) after a hard link keeps the file it replaces. When any file fails, the
    ones already placed are taken back (created: removed; replaced: restored) and the folders made
    removed. Existing targets are refused unless `force`, outputs that are one file or an input
    always (check_outputs_apart), all before anything is written. Files ending in an `executable`
    suffix get mode 0o755, others 0o644 (less the umask). `path_to_data`: a mapping or (path, data)
    pairs (pairs keep two names for one file apart, to be refused)."""
    pairs = path_to_data.items() if isinstance(path_to_data, Mapping) else path_to_data
    targets = [(check_output(p, force, what, probe=False), data) for p, data in pairs]
    check_outputs_apart([t for t, _ in targets], inputs, what)
    staged: list[tuple[str, Path]] = []
    placed: list[tuple[Path, str | None]] = []  # (target, the hard link keeping what it replaced; None: created)
    created: list[Path] = []  # folders this call made, removed again if it fails
    done = False
    try:
        for target, data in targets:
            created += _make_folder(target, what)
            staged.append((_stage(target, data, executable, what), target))
        for tmp, target in staged:
            placed.append(_place(tmp, target, force, what))
        done = True
    finally:
        if not done:
            for target, kept in reversed(placed):
                if kept is None:
                    _quietly(os.unlink, target)
                else:
                    _quietly(lambda k: os.replace(k, target), kept)
        for tmp, _ in staged:
            if os.path.lexists(tmp):
                _quietly(os.unlink, tmp)
        for _, kept in placed:
            if kept is not None and os.path.lexists(kept):
                _quietly(os.unlink, kept)
        if not done:
            for folder in reversed(created):
                _quietly(os.rmdir, folder)
    return [str(t) for t, _ in targets]


# A file system without hard links (FAT, some network mounts) answers os.link with one of these.
_NO_LINKS = (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK, errno.ENOSYS)


def _place(tmp: str, target: Path, force: bool, what: str) -> tuple[Path, str | None]:
    """Put the staged `tmp` at `target`; (target, the hard link keeping the file it replaced, or
    None when it created the file)."""
    try:
        if not force:
            _create(tmp, target)
            return target, None
        kept = _keep(target)
        try:
            os.replace(tmp, target)
        except OSError:
            if kept is not None:
                _quietly(os.unlink, kept)
            raise
        return target, kept
    except FileExistsError:
        raise OutputFileError(f"{what} {clip(target)} exists (it appeared after autopar checked: another process "
                              "wrote it); pass --force to overwrite it, or choose another path") from None
    except OSError as exc:
        raise OutputFileError(f"cannot write {what} {clip(target)}: {_reason(exc)}; choose a writable path") from None


def _create(tmp: str, target: Path) -> None:
    """Link `tmp` at `target`, which must not exist (FileExistsError otherwise). Without hard links:
    the name taken by an exclusive create, then the staged file renamed over it."""
    try:
        os.link(tmp, target)
    except FileExistsError:
        raise
    except OSError as exc:
        if exc.errno not in _NO_LINKS:
            raise
        os.close(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        try:
            os.replace(tmp, target)
        except OSError:
            _quietly(os.unlink, target)  # the empty name it took
            raise


def _keep(target: Path) -> str | None:
    """A second name for the file at `target` (a hard link, or a copy where links are refused), so
    a failed set can put it back; None when there is no file."""
    for _ in range(100):
        kept = target.with_name(f".{target.name[:40]}.{os.urandom(6).hex()}.keep")
        try:
            os.link(target, kept, follow_symlinks=False)
            return str(kept)
        except FileNotFoundError:
            return None
        except FileExistsError:
            continue
        except OSError as exc:
            if exc.errno not in _NO_LINKS:
                raise
            import shutil

            shutil.copy2(target, kept, follow_symlinks=False)
            return str(kept)
    raise FileExistsError(errno.EEXIST, "no free name for a backup", str(target))


def _quietly(fn, path) -> None:
    try:
        fn(path)
    except OSError:
        pass


def _make_folder(target: Path, what: str) -> list[Path]:
    """Create target's missing folders; returns them, outermost first."""
    missing = []
    for folder in (target.parent, *target.parent.parents):
        if folder.exists():
            break
        missing.append(folder)
    missing.reverse()
    try:
        for folder in missing:
            folder.mkdir()
    except OSError as exc:
        for folder in reversed(missing):
            _quietly(os.rmdir, folder)
        raise OutputFileError(f"cannot write {what} {clip(target)}: {_reason(exc)}; choose a writable path") from None
    return missing


def write_output(path: Path | str, data: str | bytes, *, force: bool, what: str = "output",
                 inputs: Sequence[Path | str] = ()) -> str:
    """Write one file atomically (see write_outputs); returns its path."""
    return write_outputs({path: data}, force=force, what=what, inputs=inputs)[0]


def _stage(target: Path, data: str | bytes, executable: tuple[str, ...], what: str) -> str:
    """A temporary file in target's folder holding `data`, with the target's final mode."""
    import tempfile  # only commands that write pay for it (and for `random`): issue 15

    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name[:40]}.", suffix=".tmp", dir=target.parent)
    except OSError as exc:
        raise OutputFileError(f"cannot write {what} {clip(target)}: {_reason(exc)}; choose a writable path") from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o755 if target.name.endswith(executable) else 0o644
        os.chmod(tmp, mode & ~umask)
    except OSError as exc:
        os.unlink(tmp)
        raise OutputFileError(f"cannot write {what} {clip(target)}: {_reason(exc)}; choose a writable path") from None
    except BaseException:  # interrupted mid-write: leave nothing behind
        os.unlink(tmp)
        raise
    return tmp


class YamlKeyError(ValueError):
    """A YAML mapping whose keys are not names, or that names one twice (strict_yaml)."""


def strict_yaml(text: str, fast: bool = False) -> Any:
    """YAML as yaml.safe_load reads it, but a key that is not a string (`1: 2`, `null: x`) and a key
    given twice in one mapping (where PyYAML keeps the second silently) raise YamlKeyError naming the
    key and its line. `fast`: libyaml's parser where PyYAML has it (the constructor is the same)."""
    import yaml

    base = getattr(yaml, "CSafeLoader", yaml.SafeLoader) if fast else yaml.SafeLoader

    class Strict(base):  # type: ignore[misc, valid-type]
        pass

    def mapping(loader, node, deep=False):
        seen: set[str] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = loader.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if not isinstance(key, str):
                raise YamlKeyError(f"key {key!r} at line {line} is not a name; quote it or rename it")
            if key in seen:
                raise YamlKeyError(f"key {key!r} appears twice in one mapping (again at line {line}); keep one")
            seen.add(key)
        return yaml.constructor.SafeConstructor.construct_mapping(loader, node, deep=deep)

    Strict.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, mapping)
    return yaml.load(text, Loader=Strict)
