"""Why a file or directory could not be written, in words a person can act on."""

from __future__ import annotations

from pathlib import Path


def why_not_written(path: Path, exc: BaseException, is_directory: bool = False) -> str:
    """Why `path` (a file, or with `is_directory` a directory to create) could not be written.

    A file standing where a directory must be is named, since the OS only says "File exists" or
    "Not a directory"; otherwise the OS's own reason.
    """
    if isinstance(exc, FileExistsError | NotADirectoryError):
        must_be_dirs = [*reversed(path.parents), *([path] if is_directory else [])]
        blocker = next((p for p in must_be_dirs if p.exists() and not p.is_dir()), None)
        if blocker is not None:
            return f"{blocker} is a file, not a directory"
    return getattr(exc, "strerror", None) or str(exc)
