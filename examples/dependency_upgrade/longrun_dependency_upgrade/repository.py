"""The forge's git repositories (bare, on disk, through dulwich: no git binary needed).

A repository is created on first use holding ``sample_project.APPLICATION`` on ``main``. Commits
take whole files (path -> text) on top of a parent, as the agent proposes them; the diff between two
commits is counted per file in added and removed lines; a checkout writes a commit's files out for CI.
Names that could leave the repositories' directory or corrupt a ref are refused (``BadName``).
"""

from __future__ import annotations

import difflib
import re
import shutil
import stat
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from dulwich.objects import Blob, Commit, Tree
from dulwich.repo import Repo

from longrun_dependency_upgrade.sample_project import APPLICATION

MAIN = "main"
IDENTITY = b"longrun forge <forge@longrun.invalid>"
_FILE_MODE = 0o100644
_SEGMENT = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
_SHA = re.compile(r"^[0-9a-f]{40}$")


class BadName(ValueError):
    """A repository, branch or file name the forge refuses."""


def _checked_path(name: str, what: str) -> list[str]:
    parts = name.split("/")
    if not name or len(name) > 255 or not all(_SEGMENT.match(p) and not p.endswith(".lock") for p in parts):
        raise BadName(f"{what} {name!r}: expected /-separated names of letters, digits, '_', '.', '-'")
    if any(p in (".git", "..") or ".." in p for p in parts):
        raise BadName(f"{what} {name!r} names a reserved path")
    return parts


def _flatten(repo: Repo, tree_id: bytes, prefix: str = "") -> dict[str, bytes]:
    """path -> blob id of every file under a tree."""
    found: dict[str, bytes] = {}
    tree = repo[tree_id]
    assert isinstance(tree, Tree)
    for entry in tree.items():
        path = f"{prefix}{entry.path.decode()}"
        if stat.S_ISDIR(entry.mode):
            found.update(_flatten(repo, entry.sha, f"{path}/"))
        else:
            found[path] = entry.sha
    return found


def _build_tree(repo: Repo, files: Mapping[str, bytes]) -> bytes:
    """A tree (and its subtrees) holding ``files`` (path -> blob id); its id."""
    tree, subdirs = Tree(), {}
    for path, blob_id in files.items():
        head, sep, rest = path.partition("/")
        if sep:
            subdirs.setdefault(head, {})[rest] = blob_id
        else:
            tree.add(head.encode(), _FILE_MODE, blob_id)
    for name, content in subdirs.items():
        tree.add(name.encode(), stat.S_IFDIR, _build_tree(repo, content))
    repo.object_store.add_object(tree)
    return tree.id


def _text(repo: Repo, blob_id: bytes | None) -> list[str]:
    if blob_id is None:
        return []
    blob = repo[blob_id]
    assert isinstance(blob, Blob)
    return blob.data.decode(errors="replace").splitlines()


class Repositories:
    """Every repository of the forge, one bare git repository each under ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root

    @contextmanager
    def _open(self, repo: str) -> Iterator[Repo]:
        path = self.root.joinpath(*_checked_path(repo, "repository")).with_suffix(".git")
        if not path.exists():
            path.mkdir(parents=True)
            with Repo.init_bare(str(path)) as created:
                self._seed(created)
        with Repo(str(path)) as opened:
            yield opened

    def _seed(self, repo: Repo) -> None:
        blobs = {}
        for path, text in APPLICATION.items():
            blob = Blob.from_string(text.encode())
            repo.object_store.add_object(blob)
            blobs[path] = blob.id
        sha = self._commit(repo, None, _build_tree(repo, blobs), "Payments application on payment-sdk 4.2.0")
        repo.refs[f"refs/heads/{MAIN}".encode()] = sha
        repo.refs.set_symbolic_ref(b"HEAD", f"refs/heads/{MAIN}".encode())

    @staticmethod
    def _commit(repo: Repo, parent: bytes | None, tree_id: bytes, message: str) -> bytes:
        commit = Commit()
        commit.tree = tree_id
        commit.parents = [] if parent is None else [parent]
        commit.author = commit.committer = IDENTITY
        commit.author_time = commit.commit_time = int(time.time())
        commit.author_timezone = commit.commit_timezone = 0
        commit.encoding = b"UTF-8"
        commit.message = message.encode()
        repo.object_store.add_object(commit)
        return commit.id

    def resolve(self, repo: str, ref: str) -> str | None:
        """The commit a branch name or a full commit sha points at, or None."""
        with self._open(repo) as opened:
            if _SHA.match(ref):
                try:
                    return ref if isinstance(opened[ref.encode()], Commit) else None
                except KeyError:
                    return None
            _checked_path(ref, "branch")
            try:
                return opened.refs[f"refs/heads/{ref}".encode()].decode()
            except KeyError:
                return None

    def set_branch(self, repo: str, name: str, sha: str) -> None:
        _checked_path(name, "branch")
        with self._open(repo) as opened:
            opened.refs[f"refs/heads/{name}".encode()] = sha.encode()

    def commit(self, repo: str, parent: str, files: Mapping[str, str], message: str) -> str:
        """A commit on ``parent`` whose tree is the parent's with ``files`` written whole; its sha."""
        for path in files:
            _checked_path(path, "file")
        with self._open(repo) as opened:
            parent_commit = opened[parent.encode()]
            assert isinstance(parent_commit, Commit)
            tree = _flatten(opened, parent_commit.tree)
            for path, text in files.items():
                if any(other.startswith(f"{path}/") or path.startswith(f"{other}/") for other in tree if other != path):
                    raise BadName(f"file {path!r} clashes with a directory of the same name")
                blob = Blob.from_string(text.encode())
                opened.object_store.add_object(blob)
                tree[path] = blob.id
            return self._commit(opened, parent.encode(), _build_tree(opened, tree), message).decode()

    def diff(self, repo: str, old: str, new: str) -> dict[str, Any]:
        """What changed from ``old`` to ``new``: per file the lines added and removed, and the totals."""
        with self._open(repo) as opened:
            before, after = (self._tree_of(opened, sha) for sha in (old, new))
            changed = []
            for path in sorted(before.keys() | after.keys()):
                if before.get(path) == after.get(path):
                    continue
                added = removed = 0
                lines = difflib.SequenceMatcher(None, _text(opened, before.get(path)), _text(opened, after.get(path)),
                                                autojunk=False)
                for tag, i1, i2, j1, j2 in lines.get_opcodes():
                    removed += i2 - i1 if tag in ("replace", "delete") else 0
                    added += j2 - j1 if tag in ("replace", "insert") else 0
                changed.append({"path": path, "added": added, "removed": removed})
        return {"files": changed, "added": sum(f["added"] for f in changed),
                "removed": sum(f["removed"] for f in changed)}

    @staticmethod
    def _tree_of(repo: Repo, sha: str) -> dict[str, bytes]:
        commit = repo[sha.encode()]
        assert isinstance(commit, Commit)
        return _flatten(repo, commit.tree)

    def checkout(self, repo: str, sha: str, dest: Path) -> None:
        """The commit's files written under ``dest`` (a work tree without ``.git``)."""
        with self._open(repo) as opened:
            for path, blob_id in self._tree_of(opened, sha).items():
                blob = opened[blob_id]
                assert isinstance(blob, Blob)
                target = dest.joinpath(*path.split("/"))
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(blob.data)

    def reset(self) -> None:
        """Every repository gone: the next use seeds it anew."""
        if self.root.exists():
            shutil.rmtree(self.root)
        self.root.mkdir(parents=True)
