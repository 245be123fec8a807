"""Reading a template repository's history with dulwich: commits, the template files they change, tags.

No Django here: app/prompts/history.py turns what this returns into template versions. A local
path is read in place; a URL (http, https or file) is fetched into a bare mirror in a cache folder,
its refs as the remote has them. Every failure of git, the network or the files is a RepositoryError.
"""

import difflib
import re
import stat
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import urllib3
from dulwich.client import get_transport_and_path
from dulwich.diff_tree import CHANGE_COPY, RenameDetector, TreeChange, tree_changes
from dulwich.errors import GitProtocolError, NotGitRepository
from dulwich.objects import Blob, Commit, ObjectID, Tag, Tree
from dulwich.refs import Ref
from dulwich.repo import Repo
from dulwich.walk import ORDER_TOPO, Walker
from dulwich.wildmatch import MalformedPattern, translate

URL_SCHEMES = ("http", "https", "file")
HEAD = Ref(b"HEAD")
_HEX = re.compile(r"[0-9a-fA-F]{7,40}")

PathMatcher = Callable[[str], bool]


class RepositoryError(Exception):
    """The repository could not be read: not a git repository, a ref or object missing, the network."""


@dataclass(frozen=True, slots=True)
class FileChange:
    """A template file a commit changed: ``path`` is "" when the commit deleted it (or moved it out of
    the globs), ``old_path`` "" when it added it (or moved it in); both differ on a rename."""

    path: str
    old_path: str
    content: str
    old_content: str

    @property
    def diff(self) -> str:
        """Unified diff of the old content to the new one."""
        return unified_diff(self.old_content, self.content, old_path=self.old_path, path=self.path)


@dataclass(frozen=True, slots=True)
class CommitInfo:
    """A commit and the template files it changed (none: it touched no template)."""

    sha: str
    author: str
    author_email: str
    committed_at: datetime
    message: str
    changes: tuple[FileChange, ...]


def is_url(location: str) -> bool:
    """True for a location the server fetches (a URL), False for a path it reads in place."""
    return urlsplit(location).scheme.lower() in URL_SCHEMES


def location_problem(location: str) -> str | None:
    """Why a location cannot be registered (None when it can): an absolute path, or an http(s) or
    file URL; no other scheme (ssh needs keys the server does not have)."""
    scheme = urlsplit(location).scheme.lower()
    if scheme in URL_SCHEMES:
        return None if urlsplit(location).netloc or scheme == "file" else "the URL has no host"
    if "://" in location:
        return f"{scheme}:// is not fetched; use an http(s):// or file:// URL, or a local path"
    return None if Path(location).is_absolute() else "a local path must be absolute"


def redacted(location: str) -> str:
    """The location without the user name and password a URL may carry."""
    if not is_url(location):
        return location
    parts = urlsplit(location)
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=host))


def path_matcher(globs: Sequence[str]) -> PathMatcher:
    """A test of a file path against git wildmatch patterns (``*`` stops at ``/``, ``**`` does not).
    Raises ValueError for a malformed pattern."""
    try:
        patterns = [re.compile(translate(glob.encode())) for glob in globs]
    except MalformedPattern as exc:
        raise ValueError(f"malformed glob: {exc}") from None
    return lambda path: any(pattern.fullmatch(path.encode()) for pattern in patterns)


@contextmanager
def opened(location: str, *, cache: Path) -> Iterator[Repo]:
    """The repository at ``location``, fetched first into ``cache`` when it is a URL; closed after."""
    try:
        with _git_errors():
            repo = _fetched(location, cache) if is_url(location) else Repo(location)
    except RepositoryError as exc:  # the message may quote the URL: never with its credentials
        raise RepositoryError(str(exc).replace(location, redacted(location))) from None
    try:
        yield repo
    finally:
        repo.close()


def head(repo: Repo, ref: str) -> str:
    """The commit a branch, a full ref name or (blank) HEAD points at."""
    candidates = [ref] if ref.startswith("refs/") else [f"refs/heads/{ref}", f"refs/tags/{ref}"]
    for name in candidates if ref else ["HEAD"]:
        try:
            sha = repo.refs[Ref(name.encode())]
        except KeyError:
            continue
        with _git_errors():
            return _peeled(repo, sha).decode()
    raise RepositoryError(f"no ref {ref or 'HEAD'} in the repository")


def commits_since(repo: Repo, head_sha: str, since: str) -> list[str]:
    """The commits reachable from ``head_sha`` and not from ``since``, parents before children.
    ``since`` "" or not in the repository (history rewritten, another repository): all of them."""
    exclude = [ObjectID(since.encode())] if since and _commit(repo, since) is not None else []
    with _git_errors():
        walker = Walker(
            repo.object_store, include=[ObjectID(head_sha.encode())], exclude=exclude, order=ORDER_TOPO
        )
        return [entry.commit.id.decode() for entry in reversed(list(walker))]


def read_commit(repo: Repo, sha: str, matches: PathMatcher) -> CommitInfo:
    """The commit and the template files it changed against its first parent, renames detected.

    A merge changes a file only where its result differs from every parent (git's combined diff):
    what came from the merged branch was that branch's commit's change, not the merge's.
    """
    with _git_errors():
        commit = repo[sha.encode()]
        assert isinstance(commit, Commit)
        changes = tuple(_template_changes(repo, commit, matches))
    return _info(commit, changes)


def file_at(repo: Repo, sha: str, path: str) -> CommitInfo | None:
    """The commit with one change, ``path`` as it was then against its first parent (often the same
    text, for a commit that did not touch it); None when the file was not there."""
    commit = _commit(repo, sha)
    if commit is None:
        return None
    content = _file(repo, commit.tree, path)
    if content is None:
        return None
    parent = _commit(repo, commit.parents[0].decode()) if commit.parents else None
    old = _file(repo, parent.tree, path) if parent is not None else None
    change = FileChange(
        path=path, old_path=path if old is not None else "", content=content, old_content=old or ""
    )
    return _info(commit, (change,))


def first_parent(repo: Repo, sha: str) -> str | None:
    """The commit's first parent; None for a root commit or a commit the repository lacks."""
    commit = _commit(repo, sha)
    return commit.parents[0].decode() if commit is not None and commit.parents else None


def text_at(repo: Repo, sha: str, path: str) -> str | None:
    """A file's text at a commit; None when the commit or the file is not there."""
    commit = _commit(repo, sha)
    return None if commit is None else _file(repo, commit.tree, path)


def bytes_at(repo: Repo, sha: str, path: str) -> bytes | None:
    """A regular file's bytes at a commit; None when the commit or the file is not there."""
    commit = _commit(repo, sha)
    if commit is None:
        return None
    with _git_errors():
        tree = repo[commit.tree]
        assert isinstance(tree, Tree)
        try:
            mode, blob = tree.lookup_path(repo.object_store.__getitem__, path.encode())
        except KeyError:
            return None
        data = repo[blob]
        return data.data if stat.S_ISREG(mode) and isinstance(data, Blob) else None


def paths_at(repo: Repo, sha: str) -> list[str]:
    """Every regular file's path at a commit, sorted. Raises RepositoryError for an unknown commit."""
    commit = _commit(repo, sha)
    if commit is None:
        raise RepositoryError(f"no commit {sha} in the repository")
    with _git_errors():
        entries = repo.object_store.iter_tree_contents(commit.tree)
        return sorted(entry.path.decode(errors="replace") for entry in entries if stat.S_ISREG(entry.mode))


def tags(repo: Repo) -> dict[str, str]:
    """Each tag's name and the commit it points at (an annotated tag peeled); tags of other objects
    are left out."""
    found = {}
    with _git_errors():
        for name, sha in repo.refs.as_dict(Ref(b"refs/tags")).items():
            commit = _peeled(repo, sha)
            if isinstance(repo[commit], Commit):
                found[name.decode(errors="replace")] = commit.decode()
    return found


def last_change(repo: Repo, sha: str, path: str) -> str | None:
    """The latest commit at or before ``sha`` that changed ``path`` (git log's history simplification
    at merges); None when the file is not there at ``sha``."""
    commit = _commit(repo, sha)
    if commit is None or _file(repo, commit.tree, path) is None:
        return None
    with _git_errors():
        walker = Walker(
            repo.object_store,
            include=[commit.id],
            paths=[path.encode()],
            max_entries=1,
            simplify_history=True,
        )
        return next((entry.commit.id.decode() for entry in walker), None)


def find_commit(repo: Repo, name: str) -> str | None:
    """The full sha of the commit a full or short (at least 7 hex digits) sha names; None when no
    commit, or more than one, has it."""
    if not _HEX.fullmatch(name):
        return None
    if len(name) == 40:
        return name.lower() if _commit(repo, name.lower()) is not None else None
    with _git_errors():
        shas = [
            sha for sha in repo.object_store.iter_prefix(name.lower().encode()) if _commit(repo, sha.decode())
        ]
    return shas[0].decode() if len(shas) == 1 else None


def unified_diff(old: str, new: str, *, old_path: str, path: str) -> str:
    """git-style unified diff (3 lines of context); for a rename without edits, git's two rename lines;
    "" when nothing changed."""
    if old == new and old_path and path and old_path != path:
        return f"rename from {old_path}\nrename to {path}\n"
    lines = difflib.unified_diff(
        old.splitlines(keepends=True),
        new.splitlines(keepends=True),
        fromfile=f"a/{old_path}" if old_path else "/dev/null",
        tofile=f"b/{path}" if path else "/dev/null",
    )
    # A last line without its newline would run into the next hunk line, as git's "\ No newline" says.
    return "".join(
        line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines
    )


@contextmanager
def _git_errors() -> Iterator[None]:
    try:
        yield
    except (NotGitRepository, GitProtocolError, urllib3.exceptions.HTTPError, OSError, KeyError) as exc:
        raise RepositoryError(_message(exc)) from exc


def _message(exc: BaseException) -> str:
    if isinstance(exc, NotGitRepository):
        return "not a git repository"
    if isinstance(exc, KeyError):
        return f"object or ref missing from the repository: {exc}"
    return f"{exc.__class__.__name__}: {exc}"


def _fetched(location: str, cache: Path) -> Repo:
    """A bare mirror of the remote in ``cache``: objects fetched, refs (and HEAD) as the remote's."""
    cache.parent.mkdir(parents=True, exist_ok=True)
    repo = Repo(str(cache)) if (cache / "HEAD").exists() else Repo.init_bare(str(cache), mkdir=True)
    try:
        client, path = get_transport_and_path(location)
        # Branches and tags only: a host's other refs (GitHub's refs/pull/*) would fetch every fork's work.
        result = client.fetch(path, repo, ref_prefix=[b"HEAD", b"refs/heads/", b"refs/tags/"])
        remote = {n: s for n, s in result.refs.items() if s and n != b"HEAD" and not n.endswith(b"^{}")}
        for name in set(repo.refs.allkeys()) - set(remote) - {b"HEAD"}:
            del repo.refs[name]
        for name, sha in remote.items():
            repo.refs[name] = sha
        if HEAD in result.symrefs:
            repo.refs.set_symbolic_ref(HEAD, result.symrefs[HEAD])
    except BaseException:
        repo.close()
        raise
    return repo


def _peeled(repo: Repo, sha: bytes) -> bytes:
    obj = repo[sha]
    while isinstance(obj, Tag):
        obj = repo[obj.object[1]]
    return obj.id


def _commit(repo: Repo, sha: str) -> Commit | None:
    with _git_errors():
        if ObjectID(sha.encode()) not in repo.object_store:
            return None
        obj = repo[ObjectID(sha.encode())]
    return obj if isinstance(obj, Commit) else None


def _file(repo: Repo, tree_id: ObjectID, path: str) -> str | None:
    """A regular file's text in a tree (UTF-8, undecodable bytes replaced); None when it is not there."""
    with _git_errors():
        tree = repo[tree_id]
        assert isinstance(tree, Tree)
        try:
            mode, sha = tree.lookup_path(repo.object_store.__getitem__, path.encode())
        except KeyError:
            return None
        return _text(repo, sha) if stat.S_ISREG(mode) else None


def _text(repo: Repo, sha: ObjectID) -> str:
    blob = repo[sha]
    assert isinstance(blob, Blob)
    return blob.data.decode("utf-8", errors="replace")


def _template_changes(repo: Repo, commit: Commit, matches: PathMatcher) -> Iterator[FileChange]:
    parents = [parent for sha in commit.parents if (parent := _commit(repo, sha.decode())) is not None]
    first = parents[0].tree if parents else None
    other_trees = [parent.tree for parent in parents[1:]]
    detector = RenameDetector(repo.object_store)
    for change in tree_changes(repo.object_store, first, commit.tree, rename_detector=detector):
        old_path, path = _path(change.old), _path(change.new)
        if change.type == CHANGE_COPY:
            old_path = ""  # the source file stays what it was: the copy is a new file
        old_path, path = (old_path if matches(old_path) else ""), (path if matches(path) else "")
        if not (old_path or path) or any(_came_from(repo, tree, change, path) for tree in other_trees):
            continue
        yield FileChange(
            path=path,
            old_path=old_path,
            content=_text(repo, change.new.sha) if path and change.new and change.new.sha else "",
            old_content=_text(repo, change.old.sha) if old_path and change.old and change.old.sha else "",
        )


def _path(entry: object) -> str:
    """A tree entry's path when it is a regular file, else ""."""
    mode, path = getattr(entry, "mode", None), getattr(entry, "path", None)
    return path.decode(errors="replace") if path and mode and stat.S_ISREG(mode) else ""


def _came_from(repo: Repo, tree: ObjectID, change: TreeChange, path: str) -> bool:
    """True when a merge's other parent already had the change: the same file there, or (a deletion)
    no file there."""
    if not path:
        return change.old is not None and _file(repo, tree, _path(change.old)) is None
    return _file(repo, tree, path) == _text(repo, change.new.sha)  # type: ignore[union-attr]


def _info(commit: Commit, changes: tuple[FileChange, ...]) -> CommitInfo:
    name, _, email = commit.author.decode(errors="replace").partition(" <")
    offset = timezone(timedelta(seconds=commit.commit_timezone))
    return CommitInfo(
        sha=commit.id.decode(),
        author=name.strip(),
        author_email=email.rstrip(">").strip(),
        committed_at=datetime.fromtimestamp(commit.commit_time, tz=offset),
        message=commit.message.decode("utf-8", errors="replace").rstrip("\n"),
        changes=changes,
    )
