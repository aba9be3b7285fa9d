"""Hadoop's local file system through java.nio (infra/jvm/src/adattr/hadoop), in the test
session's own JVM: the one the job's driver gets on a local master."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any


def _fs(spark: Any, raw: bool) -> Any:
    jvm = spark._jvm
    conf = spark._jsc.hadoopConfiguration()
    fs = jvm.org.apache.hadoop.fs.FileSystem.get(jvm.java.net.URI("file:///"), conf)
    return fs.getRawFileSystem() if raw else fs


def test_the_session_uses_it_for_files_and_for_file_contexts(spark: Any) -> None:
    jvm = spark._jvm
    conf = spark._jsc.hadoopConfiguration()
    assert _fs(spark, raw=False).getClass().getName() == "adattr.hadoop.NioLocalFileSystem"
    assert _fs(spark, raw=True).getClass().getName() == "adattr.hadoop.NioRawLocalFileSystem"
    context = jvm.org.apache.hadoop.fs.FileContext.getFileContext(
        jvm.java.net.URI("file:///"), conf
    )
    assert context.getDefaultFileSystem().getClass().getName() == "adattr.hadoop.NioLocalFs"


def test_link_status_and_permissions_answer_as_hadoops_own(spark: Any, tmp_path: Path) -> None:
    jvm = spark._jvm
    raw = _fs(spark, raw=True)

    def path(p: Path) -> Any:
        return jvm.org.apache.hadoop.fs.Path(p.as_uri())

    hadoops = jvm.org.apache.hadoop.fs.RawLocalFileSystem()
    hadoops.initialize(jvm.java.net.URI("file:///"), spark._jsc.hadoopConfiguration())
    data = tmp_path / "data.json"
    data.write_text("{}")
    (tmp_path / "folder").mkdir()
    (tmp_path / "link").symlink_to(data)
    # A file, a folder, a symbolic link (left to Hadoop's code): the status Hadoop's own gives.
    for p in (data, tmp_path / "folder", tmp_path / "link"):
        ours, theirs = raw.getFileLinkStatus(path(p)), hadoops.getFileLinkStatus(path(p))
        assert (ours.isFile(), ours.isDirectory(), ours.isSymlink(), ours.getLen()) == (
            theirs.isFile(),
            theirs.isDirectory(),
            theirs.isSymlink(),
            theirs.getLen(),
        )
    assert raw.getFileLinkStatus(path(data)).isFile()
    assert raw.getFileLinkStatus(path(tmp_path / "folder")).isDirectory()
    # A missing path is FileNotFoundException, as before.
    try:
        raw.getFileLinkStatus(path(tmp_path / "missing"))
    except Exception as e:  # py4j wraps the Java exception
        assert "FileNotFoundException" in str(e)
    else:
        raise AssertionError("a missing path has no status")
    # Every permission bit lands as asked, through java.nio.
    for mode in (0o640, 0o755, 0o600, 0o777, 0o000):
        raw.setPermission(path(data), jvm.org.apache.hadoop.fs.permission.FsPermission(mode))
        assert stat.S_IMODE(os.stat(data).st_mode) == mode
    # A rename through a file context (Delta's log store) renames, and refuses an existing target.
    context = jvm.org.apache.hadoop.fs.FileContext.getFileContext(
        jvm.java.net.URI("file:///"), spark._jsc.hadoopConfiguration()
    )
    other = tmp_path / "other.json"
    options = spark.sparkContext._gateway.new_array(jvm.org.apache.hadoop.fs.Options.Rename, 0)
    context.rename(path(data), path(other), options)
    assert other.read_text() == "{}" and not data.exists()
    data.write_text("[]")
    try:
        context.rename(path(data), path(other), options)
    except Exception as e:
        assert "FileAlreadyExistsException" in str(e)
    else:
        raise AssertionError("a rename must not replace an existing file")
    assert other.read_text() == "{}"
