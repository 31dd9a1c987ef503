"""Network streams without a model: which URLs a server opens, and the reader against real loopback
streams (RTSP from GStreamer's server, live HLS from FFmpeg over HTTP): frames at the stream's fps,
one clear error for a stream that never opens, drops and reconnects, a slow consumer, Stop."""

from __future__ import annotations

import ipaddress
import itertools
import json
import threading
import time

import pytest

from hermes.cli.main import main
from hermes.video.clips import make_clip
from hermes.video.network import Link, NetworkReader, NewestFrames, StreamError
from hermes.video.urls import UrlPolicy, UrlRefused, redact
from tests.helpers import wait_for
from tests.network_servers import free_port, http_folder, live_hls, mjpeg_camera, rtmp_server, rtsp_server

pytestmark = pytest.mark.timeout(120)


def fixed(*addresses: str):
    """A resolver that answers `addresses` whatever the host (no DNS in tests)."""
    return lambda host: [ipaddress.ip_address(a) for a in addresses]


# -- which URLs a server opens ----------------------------------------------------------------------
def test_urls_are_refused_unless_the_server_allows_them():
    with pytest.raises(UrlRefused, match="--allow-urls"):
        UrlPolicy().check("rtsp://cam.example.com/live")
    public = UrlPolicy.parse("")
    assert public.check(" rtsp://cam.example.com/live ", fixed("93.184.216.34")) == "rtsp://cam.example.com/live"
    for url, reason in [
        ("file:///etc/passwd", "scheme 'file'"),
        ("ftp://example.com/x.mp4", "scheme 'ftp'"),
        ("/etc/passwd", "not a URL"),
        ("http://", "no host"),
        ("rtsp://cam:notaport/x", "not a valid URL"),
    ]:
        with pytest.raises(UrlRefused, match=reason):
            public.check(url, fixed("93.184.216.34"))
    for address in ["127.0.0.1", "10.1.2.3", "192.168.0.9", "169.254.169.254", "::1", "fd00::1", "::ffff:10.0.0.1"]:
        with pytest.raises(UrlRefused, match="private or local"):
            public.check("http://cam.example.com/s.m3u8", fixed(address))
    # One private address among public ones is enough to refuse (the name may resolve to either).
    with pytest.raises(UrlRefused, match="private or local"):
        public.check("http://cam.example.com/s.m3u8", fixed("93.184.216.34", "10.0.0.5"))


def test_named_hosts_and_networks_are_the_only_ones_allowed():
    named = UrlPolicy.parse("cam.local, 10.0.0.0/8,127.0.0.1")
    assert named.check("rtsp://cam.local/x", fixed("192.168.1.4"))  # named: its private address is fine
    assert named.check("rtsp://10.2.3.4:8554/x", fixed("10.2.3.4"))
    assert named.check("rtsp://127.0.0.1:8554/x")
    for url, address in [("rtsp://other.local/x", "192.168.1.5"), ("rtsp://cam.example.com/x", "93.184.216.34")]:
        with pytest.raises(UrlRefused, match="not among those"):
            named.check(url, fixed(address))
    with pytest.raises(ValueError, match="not a network"):
        UrlPolicy.parse("10.0.0.0/99")


def test_credentials_are_never_shown():
    assert redact("rtsp://ann:s3cret@cam.local:554/live?x=1") == "rtsp://***@cam.local:554/live?x=1"
    assert redact("rtsp://cam.local/live") == "rtsp://cam.local/live"
    with pytest.raises(UrlRefused) as refused:
        UrlPolicy.parse("").check("rtsp://ann:s3cret@cam.local/x", fixed("10.0.0.1"))
    assert "s3cret" not in str(refused.value)
    with pytest.raises(UrlRefused) as refused:
        UrlPolicy.parse("").check("gopher://ann:s3cret@cam.local/x")
    assert "s3cret" not in str(refused.value)


def test_the_newest_frames_are_kept_and_the_skipped_time_counted():
    from hermes.video.network import LiveFrame

    queue = NewestFrames(limit=3)
    for i in range(10):
        queue.put(LiveFrame(None, t=0.5 * i, glass=0.0))
    assert len(queue) == 3 and queue.skipped_frames == 7 and queue.skipped_s == pytest.approx(3.5)
    assert [queue.get(0).t for _ in range(3)] == [3.5, 4.0, 4.5] and queue.get(0) is None


# -- the reader against real streams ------------------------------------------------------------------
def read(reader: NetworkReader, n: int, timeout: float = 30.0) -> list:
    frames = []
    wait_for(lambda: frames.append(f) or len(frames) >= n if (f := reader.get(0.5)) is not None else False, timeout)
    return frames


def test_an_rtsp_stream_is_sampled_at_its_fps_with_its_latency():
    with rtsp_server() as server:
        reader = NetworkReader(server.url, 2.0, max_side=64)
        reader.start()
        try:
            reader.wait_open()
            frames = read(reader, 6)
        finally:
            reader.stop()
        assert len(frames) >= 6 and reader.link is Link.STOPPED
        times = [f.t for f in frames]
        assert times == sorted(times) and all(0.4 <= b - a <= 0.6 for a, b in itertools.pairwise(times))
        assert all(f.image.shape == (48, 64, 3) for f in frames)  # 160x120 brought to 64 px on its longer side
        # On the glass before it reached the reader, by the clock of the frame that came soonest.
        assert all(reader.timeline.origin + f.t - 1e-6 <= f.glass <= time.time() for f in frames)
        assert reader.frames_decoded > len(frames)  # 10 fps in, 2 fps out


def test_a_live_hls_playlist_streams(tmp_path):
    with live_hls(tmp_path / "hls") as url:
        reader = NetworkReader(url, 1.0)
        reader.start()
        try:
            reader.wait_open()
            frames = read(reader, 3)
        finally:
            reader.stop()
    assert len(frames) >= 3 and frames[0].image.shape == (120, 160, 3)
    assert [f.t for f in frames] == sorted(f.t for f in frames)


@pytest.mark.parametrize("kind", ["rtmp", "mjpeg"])
def test_rtmp_and_an_mjpeg_camera_stream(kind):
    with rtmp_server() if kind == "rtmp" else mjpeg_camera() as url:
        reader = NetworkReader(url, 2.0)
        reader.start()
        try:
            reader.wait_open()
            frames = read(reader, 4)
        finally:
            reader.stop()
    assert frames[0].image.shape == (120, 160, 3)
    times = [f.t for f in frames]
    assert times == sorted(times) and times[-1] - times[0] >= 1.0  # 2 fps of a 10 fps stream


def test_a_video_file_over_http_is_played_at_its_pace_and_ends(tmp_path):
    make_clip(tmp_path / "clip.mp4", 3.0, fps=10, size=(160, 120))
    with http_folder(tmp_path) as base:
        reader = NetworkReader(f"{base}/clip.mp4", 2.0)
        reader.start()
        reader.wait_open()
        started = time.time()
        frames = read(reader, 6)
        assert wait_for(lambda: reader.link is Link.ENDED, 10)
    assert all(abs(f.t - 0.5 * i) <= 0.1 + 1e-6 for i, f in enumerate(frames))  # every 0.5 s, to a frame
    # Paced by its timestamps, as a player shows it: not as fast as the network delivers it.
    assert frames[-1].glass >= started + 2.0 and reader.reconnects == 0


def test_a_stream_that_never_opens_gets_one_clear_error(tmp_path):
    (tmp_path / "page.html").write_text("<html><body>not a video</body></html>")
    with http_folder(tmp_path) as base, rtsp_server(credentials="ann:s3cret") as locked:
        cases = [
            (f"rtsp://127.0.0.1:{free_port()}/cam", "connection refused"),
            (f"http://127.0.0.1:{free_port()}/live.m3u8", "connection refused"),
            (f"{base}/page.html", "not a video stream"),
            (f"{base}/missing.m3u8", "404"),
            (locked.url.replace("s3cret", "wrong"), "authentication required"),
            (locked.url.replace("ann:s3cret@", ""), "authentication required"),
        ]
        for url, reason in cases:
            links = []
            reader = NetworkReader(url, 1.0, on_link=lambda link, detail, links=links: links.append(link))
            reader.start()
            with pytest.raises(StreamError, match=reason) as failed:
                reader.wait_open()
            assert "s3cret" not in str(failed.value) and "wrong" not in str(failed.value)
            assert links == [Link.FAILED] and reader.done  # one error, no retries
        good = NetworkReader(locked.url, 1.0)
        good.start()
        good.wait_open()  # the right credentials open it
        good.stop()


def test_a_server_that_never_answers_times_out():
    with socket_that_never_answers() as port:
        reader = NetworkReader(f"rtsp://127.0.0.1:{port}/cam", 1.0, open_timeout_s=1.0, read_timeout_s=1.0)
        reader.start()
        with pytest.raises(StreamError, match="no answer within 1 s"):
            reader.wait_open()


class socket_that_never_answers:
    """A loopback port that accepts connections and never says a word."""

    def __enter__(self) -> int:
        import socket

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        return self.sock.getsockname()[1]

    def __exit__(self, *exc: object) -> None:
        self.sock.close()


def test_a_dropped_stream_reconnects_and_its_time_goes_on():
    with rtsp_server() as server:
        links: list[Link] = []
        reader = NetworkReader(server.url, 2.0, backoff_s=(0.2, 0.5), on_link=lambda link, detail: links.append(link))
        reader.start()
        try:
            reader.wait_open()
            before = read(reader, 3)
            server.stop()
            assert wait_for(lambda: reader.link is Link.RECONNECTING, 20)
            threading.Event().wait(2.0)  # down for a while: several attempts fail meanwhile
            assert reader.link is Link.RECONNECTING and reader.reconnects >= 1
            reader.frames.clear()
            server.start()
            assert wait_for(lambda: reader.link is Link.STREAMING, 30)
            after = read(reader, 3)
        finally:
            reader.stop()
    assert links[:3] == [Link.STREAMING, Link.RECONNECTING, Link.STREAMING]
    gap = reader.timeline.gaps[0]
    assert gap.at_s >= before[-1].t and gap.length_s >= 2.0
    assert after[0].t >= gap.at_s + gap.length_s - 0.5  # the stream's time went on across the gap


def test_stop_ends_the_reader_mid_reconnect():
    with rtsp_server() as server:
        reader = NetworkReader(server.url, 1.0, backoff_s=(30.0,))
        reader.start()
        reader.wait_open()
        server.stop()
        assert wait_for(lambda: reader.link is Link.RECONNECTING, 20)
        reader.stop()  # in the middle of a 30 s backoff
        reader.join(5)
        assert not reader.thread.is_alive() and reader.link is Link.STOPPED


def test_a_slow_consumer_skips_to_the_live_edge():
    with rtsp_server() as server:
        reader = NetworkReader(server.url, 5.0, queue_frames=4)
        reader.start()
        try:
            reader.wait_open()
            assert wait_for(lambda: reader.frames.skipped_frames >= 10, 30)  # nobody takes frames
            assert len(reader.frames) == 4
            newest = reader.timeline.last_t
            oldest_kept = reader.get(0).t
        finally:
            reader.stop()
    assert reader.frames.skipped_s >= 10 / 5.0 - 0.5
    assert newest - oldest_kept <= 4 / 5.0 + 0.5  # what is kept is the last second, not the start


# -- the command line ---------------------------------------------------------------------------------
def test_the_stream_command_watches_an_rtsp_stream(capsys):
    with rtsp_server() as server:
        args = ["stream", server.url, "--model", "tiny", "--dtype", "fp32", "--json", "--fps", "2"]
        # The stream runs while the model loads (the frames of those seconds are skipped): the
        # question comes late enough to find chunks read after it.
        args += ["--chunk-frames", "2", "--duration", "12", "--ask", "10:What moves?", "--max-new-tokens", "3"]
        assert main(args) == 0
    events = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    chunks = [e for e in events if e["event"] == "chunk"]
    answers = [e for e in events if e["event"] == "answer"]
    assert len(chunks) >= 2 and chunks[-1]["stream_time_s"] <= 12.0 + 1e-6
    assert len(answers) == 1 and answers[0]["frames_seen"] >= 2 and answers[0]["at_s"] <= 10.0


def test_the_stream_command_says_why_a_stream_does_not_open(capsys):
    port = free_port()
    assert main(["stream", f"rtsp://ann:s3cret@127.0.0.1:{port}/cam", "--model", "tiny"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "connection refused" in err and "s3cret" not in err


def test_ctrl_c_ends_the_stream_command(tmp_path):
    import os
    import signal
    import subprocess
    import sys

    with rtsp_server() as server:
        args = [sys.executable, "-m", "hermes", "stream", server.url, "--model", "tiny", "--dtype", "fp32"]
        args += ["--json", "--fps", "2", "--chunk-frames", "2", "--save-memory", str(tmp_path / "cam.hermes")]
        env = {**os.environ, "HF_HUB_OFFLINE": "1"}
        process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        try:
            first = process.stdout.readline()  # the first chunk is in memory
            process.send_signal(signal.SIGINT)
            out, _ = process.communicate(timeout=60)
        finally:
            process.kill()
    events = [json.loads(line) for line in [first, *out.splitlines()]]
    assert events[0]["event"] == "chunk" and events[-1] == {"event": "stopped", "note": "interrupted"}
    assert process.returncode == 0 and (tmp_path / "cam.hermes").stat().st_size > 0  # what was read is saved
