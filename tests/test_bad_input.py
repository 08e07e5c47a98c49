"""Bad input is refused with a clear error, and nothing already stored is damaged."""

from __future__ import annotations

import errno
import json
import os

import pytest

import compactlog
from compactlog.storage.fsio import FileSystem
from compactlog.storage.segment import list_segments

from .helpers import (
    FailingFS,
    append_bytes,
    batch_positions,
    body_position,
    cut_out,
    flip_bit,
    segment_files,
    truncate,
)


@pytest.fixture
def log(log_dir):
    with compactlog.open(log_dir) as log:
        log.append(b"kept", b"value")
        yield log


def assert_unchanged(log):
    assert log.end_offset == 1
    assert [(r.key, r.value) for r in log.read()] == [(b"kept", b"value")]
    assert log.append(b"next", b"ok") == 1  # and the log still accepts appends


# -- records -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "value", "match"),
    [
        ("str key", b"v", "key must be bytes"),
        (b"k", 42, "value must be bytes"),
        (7, b"v", "key must be bytes"),
        (b"k", "str value", "value must be bytes"),
        (None, b"v", "None is not allowed on a compacted log"),
    ],
)
def test_wrong_record_types_are_refused(log, key, value, match):
    with pytest.raises(compactlog.InvalidRecordError, match=match):
        log.append(key, value)
    with pytest.raises(compactlog.InvalidRecordError, match=match):
        log.append_batch([(b"fine", b"fine"), (key, value)])
    assert_unchanged(log)


def test_malformed_batches_and_metadata_are_refused(log):
    with pytest.raises(compactlog.InvalidRecordError):
        log.append_batch([(b"k", b"v", b"extra")])
    with pytest.raises(compactlog.InvalidRecordError):
        log.append_batch([(b"k", b"v")], timestamps_ms=[1, 2])
    with pytest.raises(compactlog.InvalidRecordError):
        log.append(b"k", b"v", timestamp_ms=-1)
    with pytest.raises(compactlog.InvalidRecordError):
        log.append(b"k", b"v", headers={1: b"x"})
    with pytest.raises(compactlog.InvalidRecordError):
        log.append(b"k", b"v", headers={"h": "not bytes"})
    assert_unchanged(log)


def test_a_record_over_max_record_bytes_is_refused(log_dir):
    with compactlog.open(log_dir, max_record_bytes=1000, segment_bytes=1024) as log:
        log.append(b"kept", b"value")
        with pytest.raises(compactlog.RecordTooLargeError, match="max_record_bytes=1000"):
            log.append(b"k", b"v" * 1000)
        with pytest.raises(compactlog.RecordTooLargeError):
            log.append_batch([(b"a", b"small"), (b"k", b"v" * 1000)])
        assert_unchanged(log)
        # within the limit but near segment_bytes: accepted
        offset = log.append(b"k", b"v" * 990)
        assert next(iter(log.read(start=offset))).value == b"v" * 990


# -- config --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "config",
    [
        {"segment_byte": 1024},
        {"no_such_option": True},
        {"segment_bytes": 100},
        {"segment_bytes": "64MB"},
        {"segment_bytes": True},
        {"cleanup_policy": "forever"},
        {"compression": "lz4"},
        {"sync": "sometimes"},
        {"min_cleanable_dirty_ratio": 1.5},
        {"precommit_bytes": 100},
        {"retention_ms": -1},
        {"max_record_bytes": 0},
        {"min_compaction_lag_ms": 10, "max_compaction_lag_ms": 5},
        {"cleaner_buffer_bytes": 1024},
    ],
)
def test_unknown_config_and_impossible_values_are_refused(log_dir, config):
    with pytest.raises(compactlog.ConfigError) as error:
        compactlog.open(log_dir, **config)
    assert any(name in str(error.value) for name in config)
    # on a reopen too, and the stored config is left as it was
    with compactlog.open(log_dir, segment_bytes=4096):
        pass
    with pytest.raises(compactlog.ConfigError):
        compactlog.open(log_dir, **config)
    with compactlog.open(log_dir) as log:
        assert log.config.segment_bytes == 4096


# -- foreign directories and files -----------------------------------------------------------


def test_a_directory_with_other_files_is_not_a_log(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(compactlog.NotALogError, match="not a compactlog log"):
        compactlog.open(tmp_path)
    assert sorted(os.listdir(tmp_path)) == ["notes.txt"]  # nothing written into it


def test_a_regular_file_is_not_a_log(tmp_path):
    path = tmp_path / "file"
    path.write_bytes(b"data")
    with pytest.raises(compactlog.NotALogError):
        compactlog.open(path)
    assert path.read_bytes() == b"data"


def test_a_missing_log_is_refused_without_create(tmp_path):
    with pytest.raises(compactlog.NotALogError):
        compactlog.open(tmp_path / "nope", create=False)
    with pytest.raises(compactlog.NotALogError):
        compactlog.open(tmp_path / "nope", read_only=True)
    assert not (tmp_path / "nope").exists()


def test_a_foreign_meta_file_is_refused(tmp_path):
    (tmp_path / "meta").write_text(json.dumps({"magic": "someone else"}))
    with pytest.raises(compactlog.NotALogError, match="not compactlog"):
        compactlog.open(tmp_path)


@pytest.mark.leaves_damage
def test_a_newer_format_is_refused(log_dir):
    with compactlog.open(log_dir) as log:
        log.append(b"k", b"v")
    meta = json.loads((log_dir / "meta").read_bytes())
    meta["format_version"] = 99
    (log_dir / "meta").write_text(json.dumps(meta))
    with pytest.raises(compactlog.NotALogError, match="newer"):
        compactlog.open(log_dir)


@pytest.mark.leaves_damage
def test_a_segment_with_a_foreign_header_is_refused(log_dir):
    with compactlog.open(log_dir, segment_bytes=1024) as log:
        for i in range(40):
            log.append(b"k%d" % i, b"v" * 40)
    first = segment_files(log_dir)[0]
    with open(first, "r+b") as handle:
        handle.write(b"NOTALOG!")
    with pytest.raises(compactlog.NotALogError) as error:
        compactlog.open(log_dir)
    assert error.value.path == str(first)
    with compactlog.open(log_dir, read_only=True) as log, pytest.raises(compactlog.NotALogError):
        list(log.read())


# -- damage in the middle of a segment ---------------------------------------------------------


def five_batches(log_dir, **config):
    with compactlog.open(log_dir, **config) as log:
        for i in range(5):
            log.append_batch([(b"k%d-%d" % (i, j), b"value-%d" % j) for j in range(10)])
    [segment] = segment_files(log_dir)
    return segment, batch_positions(segment)


def test_bit_flip_in_a_middle_batch_is_corruption_naming_file_and_position(log_dir):
    segment, batches = five_batches(log_dir)
    position, _length = batches[2]
    flip_bit(segment, body_position(position))
    with compactlog.open(log_dir, read_only=True) as log:
        with pytest.raises(compactlog.CorruptLogError) as error:
            list(log.read())
        assert error.value.path == str(segment)
        assert error.value.position == position
        assert f"at byte {position}" in str(error.value)
        # what comes before the damage is read, then the error: nothing is skipped silently
        seen = []
        with pytest.raises(compactlog.CorruptLogError):
            for record in log.read():
                seen.append(record.offset)
        assert seen == list(range(20))


def test_bit_flip_in_a_middle_batch_stops_an_unclean_open(log_dir):
    segment, batches = five_batches(log_dir)
    position, _length = batches[1]
    flip_bit(segment, body_position(position), bit=3)
    os.remove(log_dir / "clean_shutdown")
    size = segment.stat().st_size
    with pytest.raises(compactlog.CorruptLogError) as error:
        compactlog.open(log_dir)
    assert error.value.path == str(segment)
    assert error.value.position == position
    assert segment.stat().st_size == size  # valid data behind the damage is not truncated


@pytest.mark.leaves_damage
def test_truncated_batch_in_the_middle_is_corruption_not_a_torn_tail(log_dir):
    segment, batches = five_batches(log_dir)
    position, length = batches[2]
    cut_out(segment, position + length - 10, 10)  # the batch loses its last 10 bytes
    size = segment.stat().st_size
    with compactlog.open(log_dir, read_only=True) as log:
        with pytest.raises(compactlog.CorruptLogError) as error:
            list(log.read())
        assert error.value.path == str(segment)
        assert error.value.position == position
    with pytest.raises(compactlog.CorruptLogError) as error:
        compactlog.open(log_dir)
    assert error.value.position == position
    assert segment.stat().st_size == size


@pytest.mark.leaves_damage
def test_truncated_batch_in_the_middle_is_found_with_a_dense_index(log_dir):
    segment, batches = five_batches(log_dir, index_interval_bytes=1)
    position, _length = batches[1]
    cut_out(segment, position + 60, 30)
    size = segment.stat().st_size
    with pytest.raises(compactlog.CorruptLogError) as error:
        compactlog.open(log_dir)
    assert error.value.path == str(segment)
    assert error.value.position == position
    assert segment.stat().st_size == size


def test_damage_in_a_closed_segment_is_corruption_even_at_its_end(log_dir):
    with compactlog.open(log_dir, segment_bytes=1024) as log:
        for i in range(40):
            log.append(b"k%d" % i, b"v" * 40)
    first = segment_files(log_dir)[0]
    position, _length = batch_positions(first)[-1]
    flip_bit(first, body_position(position))
    with (
        compactlog.open(log_dir, read_only=True) as log,
        pytest.raises(compactlog.CorruptLogError) as error,
    ):
        list(log.read())
    assert error.value.path == str(first)
    assert error.value.position == position


# -- torn tails --------------------------------------------------------------------------------


@pytest.mark.parametrize("kept", [0, 10, 47, 48, 60])
def test_truncated_trailing_batch_is_dropped_and_reported(log_dir, kept):
    segment, batches = five_batches(log_dir)
    position, _length = batches[-1]
    truncate(segment, position + kept)
    with compactlog.open(log_dir) as log:
        dropped = kept
        if kept:
            assert any(f"torn tail of {dropped} bytes" in line for line in log.recovery_report)
        assert segment.stat().st_size == position
        # the head had published offsets 40-49: they are never handed out again
        assert any("offsets 40 to 49" in line for line in log.recovery_report)
        assert log.end_offset == 50
        assert [r.offset for r in log.read()] == list(range(40))
        assert log.append(b"new", b"record") == 50
    with compactlog.open(log_dir) as log:
        assert log.recovery_report == []
        assert [r.offset for r in log.read()][-2:] == [39, 50]


def test_garbage_after_the_last_batch_is_a_torn_tail(log_dir):
    segment, _batches = five_batches(log_dir)
    append_bytes(segment, b"\x01" * 100)
    with compactlog.open(log_dir) as log:
        assert any("torn tail of 100 bytes" in line for line in log.recovery_report)
        assert log.end_offset == 50
        assert len(list(log.read())) == 50


# -- self-protection -----------------------------------------------------------------------------


def test_appends_are_refused_below_min_free_bytes_and_reads_go_on(log_dir):
    fs = FailingFS(errno.ENOSPC)
    with compactlog.open(log_dir, _fs=fs) as log:
        log.append(b"kept", b"value")
    fs.free = 1000
    with compactlog.open(log_dir, _fs=fs, min_free_bytes=4096, update_config=True) as log:
        with pytest.raises(compactlog.WriteRefusedError, match="min_free_bytes=4096"):
            log.append(b"k", b"v")
        with pytest.raises(compactlog.WriteRefusedError):
            log.append_batch([(b"k", b"v")])
        assert [r.key for r in log.read()] == [b"kept"]
        assert log.end_offset == 1
        fs.free = None  # space is back
        assert log.append(b"next", b"ok") == 1
    with compactlog.open(log_dir, min_free_bytes=1 << 62, update_config=True) as log:
        with pytest.raises(compactlog.WriteRefusedError):
            log.append(b"k", b"v")
        assert [r.key for r in log.read()] == [b"kept", b"next"]


@pytest.mark.parametrize("error", [errno.EIO, errno.ENOSPC])
def test_a_failed_write_is_refused_cleanly_and_later_appends_work(log_dir, error):
    fs = FailingFS(error)
    with compactlog.open(log_dir, _fs=fs, sync="always") as log:
        log.append_batch([(b"a", b"1"), (b"b", b"2")])
        fs.failures = 1
        with pytest.raises(compactlog.WriteRefusedError):
            log.append(b"lost", b"x")
        fs.failures = 1
        with pytest.raises(compactlog.WriteRefusedError):
            log.append_batch([(b"lost", b"y")])
        assert [r.key for r in log.read()] == [b"a", b"b"]
        assert log.append(b"c", b"3") == 2
    with compactlog.open(log_dir) as log:
        assert log.recovery_report == []
        assert [(r.offset, r.key) for r in log.read()] == [(0, b"a"), (1, b"b"), (2, b"c")]


def test_a_failed_segment_roll_is_refused_cleanly(log_dir):
    class FailingOpen(FailingFS):
        def open(self, path, flags, mode=0o644):
            if path.endswith(".log"):
                self._maybe_fail()
            return super().open(path, flags, mode)

    fs = FailingOpen(errno.ENOSPC)
    with compactlog.open(log_dir, _fs=fs, segment_bytes=1024) as log:
        offset = 0
        while len(list_segments(str(log_dir))) < 2:
            offset = log.append(b"k%d" % offset, b"v" * 100) + 1
        fs.failures = 1
        while True:
            before = list_segments(str(log_dir))
            try:
                offset = log.append(b"k%d" % offset, b"v" * 100) + 1
            except compactlog.WriteRefusedError:
                break
            assert list_segments(str(log_dir)) == before  # the failure comes with a roll
        assert log.append(b"k%d" % offset, b"v" * 100) == offset
        assert [r.offset for r in log.read()] == list(range(offset + 1))
    with compactlog.open(log_dir) as log:
        assert [r.offset for r in log.read()] == list(range(offset + 1))


def test_a_failed_fsync_refuses_further_writes_until_reopen_and_loses_nothing_written(log_dir):
    """After a failed fsync a retry could report success for pages the kernel dropped, so
    the writer refuses appends and flushes until the log is reopened (and revalidated)."""

    class FailingSync(FileSystem):
        failures = 0

        def fdatasync(self, fd):
            if self.failures:
                self.failures -= 1
                raise OSError(errno.EIO, os.strerror(errno.EIO))
            super().fdatasync(fd)

    fs = FailingSync()
    log = compactlog.open(log_dir, sync="os", _fs=fs)
    log.append_batch([(b"a", b"1"), (b"b", b"2")])
    fs.failures = 1
    with pytest.raises(compactlog.WriteRefusedError, match="fsync failed"):
        log.flush()
    with pytest.raises(compactlog.WriteRefusedError, match="reopened"):
        log.append(b"c", b"3")
    with pytest.raises(compactlog.WriteRefusedError):
        log.flush()
    assert [r.value for r in log.read()] == [b"1", b"2"]  # reads go on
    with pytest.raises(compactlog.WriteRefusedError):
        log.close()
    with compactlog.open(log_dir) as reopened:
        assert [r.value for r in reopened.read()] == [b"1", b"2"]
        reopened.append(b"c", b"3")
        reopened.flush()
        assert reopened.end_offset == 3


@pytest.mark.parametrize("path", [b"lg", 7, None])
def test_open_with_a_path_that_is_not_a_str_names_the_argument_and_creates_nothing(
    tmp_path, monkeypatch, path
):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(compactlog.InvalidArgumentError) as found:
        compactlog.open(path)
    message = str(found.value)
    assert message.startswith("path must be a str or an os.PathLike of str"), message
    assert repr(path) in message, message
    assert os.listdir(tmp_path) == []
