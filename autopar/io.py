"""Reading user files and writing outputs, with one-line errors.

Reading: `read_text_file` refuses a missing path, a directory, a device or pipe (/dev/zero must
not hang) and a file over MAX_INPUT_FILE_BYTES before reading it, and strips a UTF-8 byte-order
mark. Writing: `write_outputs` is the one place autopar writes a file. Each file goes to a
temporary file in the same folder and is renamed over the target (os.replace, atomic on POSIX),
so a failed or interrupted write leaves nothing half-written; an existing target is refused
unless `force`; every OSError becomes one line naming the path and the reason.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any, Mapping

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


def check_output(path: Path | str, force: bool, what: str = "output") -> Path:
    """Refuse, before any work, an output path that exists (unless `force`), is a directory or a
    device, or whose folder is a file. Returns the path."""
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
            if not os.access(parent, os.W_OK | os.X_OK):
                raise OutputFileError(f"cannot write {what} {clip(p)}: Permission denied in {clip(parent)}; "
                                      "choose a writable folder")
            break
    return p


def write_outputs(path_to_data: Mapping[Path | str, str | bytes], *, force: bool, executable: tuple[str, ...] = (".sh",),
                  what: str = "output") -> list[str]:
    """Write every file or none: each to a temporary file beside its target, then all renamed in
    place. Existing targets are refused unless `force` (all checked before anything is written).
    Files ending in an `executable` suffix get mode 0o755, others 0o644 (less the umask)."""
    targets = [(check_output(p, force, what), data) for p, data in path_to_data.items()]
    staged: list[tuple[str, Path]] = []
    created: list[Path] = []  # folders this call made, removed again if it fails
    done = False
    try:
        for target, data in targets:
            created += _make_folder(target, what)
            staged.append((_stage(target, data, executable, what), target))
        for tmp, target in staged:
            try:
                os.replace(tmp, target)
            except OSError as exc:
                raise OutputFileError(f"cannot write {what} {clip(target)}: {_reason(exc)}; choose a writable path") from None
        done = True
    finally:
        for tmp, _ in staged:
            if os.path.lexists(tmp):
                _quietly(os.unlink, tmp)
        if not done:
            for folder in reversed(created):
                _quietly(os.rmdir, folder)
    return [str(t) for t, _ in targets]


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


def write_output(path: Path | str, data: str | bytes, *, force: bool, what: str = "output") -> str:
    """Write one file atomically (see write_outputs); returns its path."""
    return write_outputs({path: data}, force=force, what=what)[0]


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
