"""Publishing and fetching weight versions in an object store.

Layout under the store root:

    versions/v0000000012/model.safetensors, config.json, tokenizer files ...
    versions/v0000000012/manifest.json   {"version", "step", "files": {name: {sha256, bytes}}}
    LATEST                               {"version", "uri", "sha256" (of the manifest), ...}

A version directory is loadable as it is by `transformers.from_pretrained` and by vLLM.
Writes go files first, then the manifest, then `LATEST`: a reader that trusts `LATEST` (or a
version announced to the buffer, which carries the manifest's sha256) never sees a partial
version. Retention deletes old versions manifest first, so a half-deleted version fails to
fetch instead of verifying.
"""

from __future__ import annotations

import hashlib
import json
import re
import tempfile
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Executor, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from tba.domain import WeightVersion
from tba.errors import FailedPreconditionError, InvalidArgumentError, NotFoundError
from tba.objectstore.base import ObjectStore, join_uri, key_of
from tba.objectstore.version_files import VersionFiles, save_pretrained_files

MANIFEST = "manifest.json"
LATEST = "LATEST"
VERSIONS = "versions"
MANIFEST_FORMAT = 1
_VERSION_DIR = re.compile(r"^v(\d{10})$")
# Files below this are hashed by the thread that moves them: handing one to the hashing thread
# and waiting for its digest costs two thread wake-ups, several ms each on a busy machine, more
# than hashing it (the demo's 2.4 MB publish took 16-17 ms with the hand-off, 9-14 beside two
# busy cores without). Bigger files are hashed beside the transfer of the next ones.
HASH_BESIDE_MIN_BYTES = 32 * 1024 * 1024


class WeightsIntegrityError(FailedPreconditionError):
    """A fetched file or manifest does not match the sha256 it was published with."""


def version_key(version: int) -> str:
    return f"{VERSIONS}/v{version:010d}"


def sha256_file(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def publish_weights(
    store: ObjectStore,
    version: int,
    step: int,
    model: Any,
    tokenizer: Any,
    *,
    keep_last: int = 3,
    state_dict: Mapping[str, Any] | None = None,
    clock: Callable[[], float] = time.time,
    files_of: VersionFiles | None = None,
) -> WeightVersion:
    """Writes `model` (a transformers `PreTrainedModel`; `state_dict` overrides its tensors,
    e.g. gathered from ZeRO-3 shards) and `tokenizer` as version `version`, then the manifest,
    then `LATEST`, then deletes versions beyond the newest `keep_last`. Returns what to
    announce to the buffer. Raises FailedPreconditionError if the version already exists.
    The config records the dtype of the files (that of `state_dict` when given), so
    `from_pretrained` loads them as they are. A publisher of many versions passes the same
    `files_of` (for this model and tokenizer) each time: it writes them faster after the
    first (`VersionFiles`)."""
    if version < 1 or keep_last < 1:
        raise InvalidArgumentError("version and keep_last must be at least 1")
    prefix = version_key(version)
    if store.exists(f"{prefix}/{MANIFEST}"):
        raise FailedPreconditionError(f"weight version {version} already exists in {store.uri}")
    with tempfile.TemporaryDirectory(prefix="tba-publish-") as staging:
        folder = Path(staging)
        if files_of is not None:
            files_of.write(folder, state_dict)
        else:  # a single version: nothing to learn for the next
            save_pretrained_files(folder, model, tokenizer, state_dict)
        files = _upload_hashing(store, prefix, sorted(p for p in folder.iterdir() if p.is_file()))
    published_at_s = clock()
    manifest = json.dumps(
        {
            "format": MANIFEST_FORMAT,
            "version": version,
            "step": step,
            "published_at_s": published_at_s,
            "files": files,
        },
        indent=2,
        sort_keys=True,
    ).encode()
    store.put_bytes(f"{prefix}/{MANIFEST}", manifest)
    weights = WeightVersion(
        version=version,
        uri=join_uri(store.uri, prefix),
        sha256=hashlib.sha256(manifest).hexdigest(),
        step=step,
        published_at_s=published_at_s,
    )
    store.put_bytes(LATEST, json.dumps(_weights_to_dict(weights), sort_keys=True).encode())
    apply_retention(store, keep_last)
    return weights


def _upload_hashing(store: ObjectStore, prefix: str, paths: list[Path]) -> dict[str, Any]:
    """Uploads each file while another thread hashes the big ones (hashlib releases the GIL),
    so their sha256 costs no time beside an upload; returns the manifest's file entries."""
    files = {}
    # The executor starts its thread at the first submit: none for a version of small files.
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="tba-sha256") as hasher:
        for path in paths:
            size_bytes = path.stat().st_size
            digest = _hash(hasher, path, size_bytes)
            store.put_file(f"{prefix}/{path.name}", path)
            files[path.name] = {"sha256": digest(), "bytes": size_bytes}
    return files


def _hash(hasher: Executor, path: Path, size_bytes: int) -> Callable[[], str]:
    """The sha256 of the file (of `size_bytes`) when called: hashed on `hasher` meanwhile if
    it is big (`HASH_BESIDE_MIN_BYTES`), else here and now."""
    if size_bytes >= HASH_BESIDE_MIN_BYTES:
        return hasher.submit(sha256_file, path).result
    digest = sha256_file(path)
    return lambda: digest


def fetch_weights(store: ObjectStore, version: WeightVersion, local_dir: Path) -> Path:
    """Downloads weight version `version` (as announced by the buffer or read by
    `read_latest`) from `store` into `local_dir` and verifies it, returning `local_dir`, which
    then loads with `AutoModelForCausalLM.from_pretrained(local_dir)` or vLLM.

    The manifest must hash to `version.sha256` and name `version.version`, and every file must
    hash to the sha256 the manifest lists; otherwise WeightsIntegrityError is raised (files
    that failed are removed). NotFoundError means the version is gone (retention deletes old
    versions): fetch the latest instead. Files already in `local_dir` are overwritten; other
    files there are left alone, so use one directory per version.
    """
    prefix = key_of(store.uri, version.uri)
    raw = store.get_bytes(f"{prefix}/{MANIFEST}")
    if hashlib.sha256(raw).hexdigest() != version.sha256:
        raise WeightsIntegrityError(f"manifest of {version.uri} does not match its sha256")
    manifest = json.loads(raw)
    if manifest.get("version") != version.version:
        raise WeightsIntegrityError(
            f"manifest of {version.uri} is version {manifest.get('version')}, not {version.version}"
        )
    files: dict[str, Any] = manifest["files"]
    for name in files:
        if "/" in name or name in ("", ".", ".."):
            raise WeightsIntegrityError(f"manifest of {version.uri} names a bad file {name!r}")
    local_dir.mkdir(parents=True, exist_ok=True)
    _download_verifying(store, prefix, files, local_dir, version.uri)
    return local_dir


def _download_verifying(
    store: ObjectStore, prefix: str, files: dict[str, Any], local_dir: Path, uri: str
) -> None:
    """Downloads the files one after another while another thread hashes each big downloaded
    one (hashlib releases the GIL), so the checks of a sharded checkpoint overlap the
    downloads of the next shards instead of adding up after them. Files whose sha256 does not
    match are removed, then the fetch fails."""
    digests = []
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="tba-sha256") as hasher:
        for name in files:
            target = local_dir / name
            store.get_file(f"{prefix}/{name}", target)
            digests.append((target, _hash(hasher, target, target.stat().st_size)))
    failed = [
        target
        for (target, digest), entry in zip(digests, files.values(), strict=True)
        if digest() != entry["sha256"]
    ]
    for target in failed:
        target.unlink(missing_ok=True)
    if failed:
        names = ", ".join(target.name for target in failed)
        raise WeightsIntegrityError(f"{names} of {uri} does not match its sha256")


def read_latest(store: ObjectStore) -> WeightVersion | None:
    """The version `LATEST` names, or None before the first publish."""
    try:
        data = json.loads(store.get_bytes(LATEST))
    except NotFoundError:
        return None
    return WeightVersion(**data)


def list_versions(store: ObjectStore) -> list[int]:
    """Versions with a manifest (complete ones), ascending."""
    return sorted(v for v, complete in _version_dirs(store).items() if complete)


def apply_retention(store: ObjectStore, keep_last: int) -> list[int]:
    """Deletes all but the newest `keep_last` complete versions, never the one `LATEST` names,
    and leftovers of interrupted publishes older than those kept; returns the versions
    deleted."""
    latest = read_latest(store)
    dirs = _version_dirs(store)
    keep = set(sorted(v for v, complete in dirs.items() if complete)[-keep_last:])
    if latest is not None:
        keep.add(latest.version)
    oldest_kept = min(keep, default=0)
    deleted = [
        v for v, complete in sorted(dirs.items()) if v not in keep and (complete or v < oldest_kept)
    ]
    for v in deleted:
        # Manifest first: a half-deleted version must fail to fetch, not verify.
        store.delete(f"{version_key(v)}/{MANIFEST}")
        for key in store.list(f"{version_key(v)}/"):
            store.delete(key)
    return deleted


def _version_dirs(store: ObjectStore) -> dict[int, bool]:
    """Every version folder in the store -> whether it has a manifest."""
    dirs: dict[int, bool] = {}
    for key in store.list(f"{VERSIONS}/"):
        parts = key.split("/")
        match = _VERSION_DIR.match(parts[1]) if len(parts) == 3 else None
        if match:
            version = int(match.group(1))
            dirs[version] = dirs.get(version, False) or parts[2] == MANIFEST
    return dirs


def _weights_to_dict(weights: WeightVersion) -> dict[str, Any]:
    return {
        "version": weights.version,
        "uri": weights.uri,
        "sha256": weights.sha256,
        "step": weights.step,
        "published_at_s": weights.published_at_s,
    }
