"""Every URL a stream leads FFmpeg to passes the server's URL policy (hermes/video/gate.py): HTTP and RTSP
redirects, HLS variant playlists, segments and keys, on loopback. The policy allows 127.0.0.2 (and,
where said, 127.0.0.3); the refused server, on 127.0.0.1, records every connection that reaches it,
and none may. What is refused says so once, in one message whatever listens there; what is allowed
still streams. Without a policy (the command line) the same servers do lead FFmpeg on: the tests
would see it."""

from __future__ import annotations

import ipaddress
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from hermes.video.clips import make_clip
from hermes.video.network import Link, LiveFrame, NetworkReader, StreamError
from hermes.video.urls import UrlPolicy, UrlRefused
from tests.helpers import wait_for
from tests.network_servers import (
    RecordingListener,
    free_port,
    recording_http,
    rtsp_server,
    self_signed_tls,
)

pytestmark = pytest.mark.timeout(120)

ALLOWED = UrlPolicy.parse("127.0.0.2")
NOT_ALLOWED = "the host '127.0.0.1' is not among those this server allows"
REFUSED = f"which this server does not open ({NOT_ALLOWED})"


@pytest.fixture(scope="module")
def media(tmp_path_factory) -> Path:
    """A folder with clip.mp4 (3 s), an HLS playlist vod.m3u8 of three 1 s segments vod0-2.ts, and the
    same encrypted (AES-128): enc.m3u8, enc0-2.ts, whose key k.key its playlist names as KEY_URI."""
    root = tmp_path_factory.mktemp("media")
    make_clip(root / "clip.mp4", 3.0, fps=10, size=(160, 120))
    ffmpeg = shutil.which("ffmpeg") or "ffmpeg"
    args = [ffmpeg, "-v", "error", "-f", "lavfi", "-i", "testsrc=size=160x120:rate=10", "-t", "3", "-c:v", "libx264"]
    args += ["-preset", "ultrafast", "-g", "10", "-pix_fmt", "yuv420p", "-f", "hls", "-hls_time", "1"]
    args += ["-hls_list_size", "0"]
    subprocess.run([*args, str(root / "vod.m3u8")], check=True)
    (root / "k.key").write_bytes(bytes(range(16)))
    (root / "key.info").write_text(f"KEY_URI\n{root / 'k.key'}\n")
    subprocess.run([*args, "-hls_key_info_file", str(root / "key.info"), str(root / "enc.m3u8")], check=True)
    return root


def segments_at(playlist: str, base: str) -> str:
    """`playlist` with its segments' URIs made absolute at `base`."""
    return "\n".join(f"{base}/{line}" if line.endswith(".ts") else line for line in playlist.splitlines()) + "\n"


def refused(url: str, policy: UrlPolicy = ALLOWED) -> tuple[str, list[Link], float]:
    """The error of a reader of `url` under `policy` that never opens, the links it went through, and
    how long the refusal took."""
    links: list[Link] = []
    reader = NetworkReader(url, 2.0, policy=policy, open_timeout_s=4.0, read_timeout_s=4.0)
    reader.on_link = lambda link, detail: links.append(link)
    started = time.monotonic()
    reader.start()
    with pytest.raises(StreamError) as failed:
        reader.wait_open()
    return str(failed.value), links, time.monotonic() - started


def streamed(url: str, policy: UrlPolicy | None = ALLOWED, n: int = 3) -> list[LiveFrame]:
    """`n` frames of `url` read under `policy`."""
    reader = NetworkReader(url, 2.0, policy=policy)
    reader.start()
    frames: list[LiveFrame] = []
    try:
        reader.wait_open()
        wait_for(lambda: frames.append(f) or len(frames) >= n if (f := reader.get(0.5)) else False, 30)
    finally:
        reader.stop()
    assert len(frames) >= n and frames[0].image.shape == (120, 160, 3)
    return frames


# -- HTTP redirects -----------------------------------------------------------------------------------
def test_an_http_redirect_to_a_refused_host_is_refused_and_names_it(media):
    with recording_http(media, "127.0.0.1") as target, recording_http(media, "127.0.0.2") as origin:
        origin.redirects["/go.mp4"] = f"http://ann:s3cret@127.0.0.1:{target.port}/clip.mp4"
        error, links, _ = refused(f"{origin.base}/go.mp4")
        assert target.log == []  # not a connection, let alone a byte
    assert error == (
        f"Cannot open stream {origin.base}/go.mp4: the server redirected it to http://***@127.0.0.1:{target.port}"
        f"/clip.mp4, which this server does not open ({NOT_ALLOWED})"
    )
    assert links == [Link.FAILED] and origin.log[-1].startswith("GET /go.mp4")


def test_a_redirect_within_the_allowed_hosts_streams(media):
    with recording_http(media, "127.0.0.3") as other, recording_http(media, "127.0.0.2") as origin:
        origin.redirects["/go.mp4"] = f"{other.base}/clip.mp4"
        streamed(f"{origin.base}/go.mp4", UrlPolicy.parse("127.0.0.2,127.0.0.3"))
        assert any(line.startswith("GET /clip.mp4") for line in other.log)


def test_https_passes_the_gate_as_a_tunnel_to_the_host_it_names(media, tmp_path):
    """FFmpeg asks the gate for an HTTPS host with CONNECT: an allowed one is tunnelled to (the HLS
    stream plays), a redirect to a refused one is refused by host and port, the path unseen."""
    tls = self_signed_tls(tmp_path)
    with recording_http(media, "127.0.0.1", tls=tls) as target, recording_http(media, "127.0.0.2", tls=tls) as origin:
        streamed(f"{origin.base}/vod.m3u8")
        origin.redirects["/go.mp4"] = f"{target.base}/clip.mp4"
        error, _, _ = refused(f"{origin.base}/go.mp4")
        assert target.log == []
    assert any(line.startswith("GET /vod0.ts") for line in origin.log)
    assert error == (
        f"Cannot open stream {origin.base}/go.mp4: it leads on to {target.base}/ (by a redirect, or as a URL its "
        f"playlist names), {REFUSED}"
    )


# -- HLS: segments, keys, variant playlists --------------------------------------------------------------
@pytest.mark.parametrize("case", ["segments", "key", "variant"])
def test_an_hls_playlist_naming_a_refused_host_is_refused(media, case):
    with recording_http(media, "127.0.0.1") as target, recording_http(media, "127.0.0.2") as origin:
        if case == "segments":
            named = f"{target.base}/vod0.ts"
            origin.texts["/live.m3u8"] = [segments_at((media / "vod.m3u8").read_text(), target.base)]
        elif case == "key":
            named = f"{target.base}/k.key"
            origin.texts["/live.m3u8"] = [(media / "enc.m3u8").read_text().replace("KEY_URI", named)]
        else:  # a master playlist: one variant here, one there; one refused refuses the stream
            named = f"{target.base}/vod.m3u8"
            variants = "#EXT-X-STREAM-INF:BANDWIDTH={},RESOLUTION=160x120\n{}\n"
            master = "#EXTM3U\n" + variants.format(100000, "vod.m3u8") + variants.format(200000, named)
            origin.texts["/live.m3u8"] = [master]
        error, links, _ = refused(f"{origin.base}/live.m3u8")
        assert target.log == []
    assert links == [Link.FAILED]
    assert error == (
        f"Cannot open stream {origin.base}/live.m3u8: it leads on to {named} (by a redirect, or as a URL its "
        f"playlist names), which this server does not open ({NOT_ALLOWED})"
    )


@pytest.mark.parametrize("playlist", ["vod.m3u8", "enc.m3u8"])
def test_an_hls_stream_on_the_allowed_host_streams(media, playlist):
    with recording_http(media, "127.0.0.2") as origin:
        text = (media / playlist).read_text().replace("KEY_URI", f"{origin.base}/k.key")
        origin.texts["/play.m3u8"] = [text]
        frames = streamed(f"{origin.base}/play.m3u8")
    assert [f.t for f in frames] == sorted(f.t for f in frames)
    assert any("k.key" in line for line in origin.log) == (playlist == "enc.m3u8")  # the key came through the gate


def test_a_live_playlist_that_goes_on_to_a_refused_host_stops_once(media):
    """A playlist that streamed, then names a refused segment: the stream fails with that reason and
    is not reopened (a reopened stream would be refused again, for ever)."""
    live = (media / "vod.m3u8").read_text().replace("#EXT-X-ENDLIST\n", "")
    with recording_http(media, "127.0.0.1") as target, recording_http(media, "127.0.0.2") as origin:
        later = live.replace("SEQUENCE:0", "SEQUENCE:3")
        origin.texts["/live.m3u8"] = [live, segments_at(later, target.base)]
        links: list[Link] = []
        reader = NetworkReader(f"{origin.base}/live.m3u8", 2.0, policy=ALLOWED, backoff_s=(0.1,))
        reader.on_link = lambda link, detail: links.append(link)
        reader.start()
        reader.wait_open()
        assert wait_for(lambda: reader.link is Link.FAILED, 20)
        assert target.log == []
    assert links == [Link.STREAMING, Link.FAILED] and reader.reconnects == 0
    assert f"it leads on to {target.base}/vod0.ts" in reader.error and NOT_ALLOWED in reader.error


# -- RTSP redirects -------------------------------------------------------------------------------------
@pytest.mark.parametrize("scheme", ["rtsp", "rtsps"])
def test_an_rtsp_redirect_to_a_refused_host_is_refused(tmp_path, scheme):
    tls = self_signed_tls(tmp_path) if scheme == "rtsps" else None
    with RecordingListener("127.0.0.1", "silent") as target:
        location = f"rtsp://ann:s3cret@127.0.0.1:{target.port}/cam"
        with RecordingListener("127.0.0.2", "rtsp_redirect", location, tls) as origin:
            error, links, _ = refused(f"{scheme}://127.0.0.2:{origin.port}/cam")
        assert target.log == []
    assert error == (
        f"Cannot open stream {scheme}://127.0.0.2:{origin.port}/cam: the server redirected it to "
        f"rtsp://***@127.0.0.1:{target.port}/cam, which this server does not open ({NOT_ALLOWED})"
    )
    assert links == [Link.FAILED] and origin.log[1].startswith("OPTIONS ")  # what reached the allowed server


def test_an_rtsp_redirect_within_the_allowed_hosts_streams():
    with rtsp_server() as server, RecordingListener("127.0.0.2", "rtsp_redirect", server.url) as origin:
        streamed(f"rtsp://127.0.0.2:{origin.port}/cam", UrlPolicy.parse("127.0.0.2,127.0.0.1"))
    assert origin.log[1].startswith("OPTIONS ")


# -- what a refusal says ----------------------------------------------------------------------------------
@pytest.mark.parametrize("scheme", ["http", "rtsp"])
def test_a_refusal_says_the_same_whatever_listens_there(tmp_path, scheme):
    """A refused host is never contacted, so closed, silent, resetting ports and a 404, a web page or
    a real video all give one message, at once: a redirect cannot map the refused host's ports."""
    (tmp_path / "page.html").write_text("<html>not a video</html>")
    make_clip(tmp_path / "clip.mp4", 1.0, fps=10, size=(160, 120))
    with (
        recording_http(tmp_path, "127.0.0.1") as web,
        RecordingListener("127.0.0.1", "silent") as silent,
        RecordingListener("127.0.0.1", "reset") as reset,
    ):
        targets = [f"127.0.0.1:{free_port()}/x", f"127.0.0.1:{silent.port}/x", f"127.0.0.1:{reset.port}/x"]
        if scheme == "http":
            targets += [f"127.0.0.1:{web.port}/{path}" for path in ("missing.mp4", "page.html", "clip.mp4")]
        messages = set()
        for target in targets:
            url = f"{scheme}://{target}"
            with (
                recording_http(tmp_path, "127.0.0.2") as origin,
                RecordingListener("127.0.0.2", "rtsp_redirect", url) as rtsp,
            ):
                origin.redirects["/go"] = url
                start = f"{origin.base}/go" if scheme == "http" else f"rtsp://127.0.0.2:{rtsp.port}/cam"
                error, _, took = refused(start)
            messages.add(error.replace(start, "START").replace(url, "TARGET"))
            assert took < 2.0, (target, took)  # no timeout waited for on the silent port
        assert web.log == silent.log == reset.log == []
    assert messages == {f"Cannot open stream START: the server redirected it to TARGET, {REFUSED}"}


def test_without_a_policy_the_same_servers_do_lead_ffmpeg_on(media):
    """The command line opens what its user gives, and FFmpeg follows: the servers above would show it."""
    with recording_http(media, "127.0.0.1") as target, recording_http(media, "127.0.0.2") as origin:
        origin.redirects["/go.mp4"] = f"{target.base}/clip.mp4"
        origin.texts["/live.m3u8"] = [segments_at((media / "vod.m3u8").read_text(), target.base)]
        streamed(f"{origin.base}/go.mp4", policy=None, n=1)
        streamed(f"{origin.base}/live.m3u8", policy=None, n=1)
        assert any("clip.mp4" in line for line in target.log) and any("vod0.ts" in line for line in target.log)
    with RecordingListener("127.0.0.1", "reset") as rtsp_target:
        location = f"rtsp://127.0.0.1:{rtsp_target.port}/cam"
        with RecordingListener("127.0.0.2", "rtsp_redirect", location) as origin:
            reader = NetworkReader(f"rtsp://127.0.0.2:{origin.port}/cam", 1.0, open_timeout_s=2.0)
            reader.start()
            with pytest.raises(StreamError):
                reader.wait_open()
        assert rtsp_target.log[:1] == ["connection from 127.0.0.1"]  # FFmpeg followed the redirect


# -- DNS: the address checked is the address connected to --------------------------------------------
def test_the_gate_connects_to_the_address_it_checked_and_rechecks_each_connection(media):
    """cam.test resolves only through the policy's resolver (FFmpeg could not find it), first to the
    allowed 127.0.0.2, then, rebound, to 127.0.0.1 on the same port: the playlist streams from the
    address checked, and the segments' connections, checked again, are refused."""
    answers = {"cam.test": ["127.0.0.2"]}
    policy = UrlPolicy(True, ("127.0.0.2/32",), resolver=lambda host: [ipaddress.ip_address(a) for a in answers[host]])
    with recording_http(media, "127.0.0.2") as origin, recording_http(media, "127.0.0.1", origin.port) as target:
        streamed(f"http://cam.test:{origin.port}/vod.m3u8", policy)
        origin.texts["/rebound.m3u8"] = [(media / "vod.m3u8").read_text()]
        policy_calls = []

        def rebinding(host: str) -> list:
            policy_calls.append(host)
            address = "127.0.0.2" if len(policy_calls) == 1 else "127.0.0.1"
            return [ipaddress.ip_address(address)]

        rebound = UrlPolicy(True, ("127.0.0.2/32",), resolver=rebinding)
        error, _, _ = refused(f"http://cam.test:{origin.port}/rebound.m3u8", rebound)
        assert target.log == []
    assert f"it leads on to http://cam.test:{origin.port}/vod0.ts" in error
    assert "the host 'cam.test' is not among those this server allows" in error


def test_the_policy_gives_the_addresses_it_checked():
    resolver = lambda host: [ipaddress.ip_address("127.0.0.2")]  # noqa: E731
    assert UrlPolicy(True, ("127.0.0.2/32",), resolver=resolver).addresses("http://cam.test/x") == [
        ipaddress.ip_address("127.0.0.2")
    ]
    assert UrlPolicy(True, ("cam.test",), resolver=resolver).addresses("http://cam.test/x")  # named: resolved too
    with pytest.raises(UrlRefused, match="private or local"):
        UrlPolicy.parse("").addresses("http://127.0.0.1/x")
    with pytest.raises(UrlRefused, match="--allow-urls"):
        UrlPolicy().addresses("http://127.0.0.2/x")


def test_no_proxy_in_the_environment_refuses_http_streams(monkeypatch, media):
    """FFmpeg connects directly to the hosts no_proxy names, past the gate: with it set, nothing is opened."""
    monkeypatch.setenv("no_proxy", "127.0.0.1")
    with recording_http(media, "127.0.0.2") as origin:
        error, links, _ = refused(f"{origin.base}/clip.mp4")
        assert origin.log == []
    assert "no_proxy" in error and links == [Link.FAILED]


# -- lists that open files themselves ------------------------------------------------------------------
def test_lists_that_open_files_themselves_are_refused_with_what_they_are(media, tmp_path):
    """An ffconcat list's files and an image sequence's images are opened by FFmpeg past the gate's
    proxy option: under a policy neither is read, and nothing of theirs asked for."""
    (tmp_path / "list.ffconcat").write_text("ffconcat version 1.0\nfile vod0.ts\n")
    shutil.copy(media / "vod0.ts", tmp_path / "vod0.ts")
    ffmpeg = shutil.which("ffmpeg") or "ffmpeg"
    images = [ffmpeg, "-v", "error", "-f", "lavfi", "-i", "testsrc", "-frames:v", "3", str(tmp_path / "i%03d.jpg")]
    subprocess.run(images, check=True)
    with recording_http(tmp_path, "127.0.0.2") as origin:
        for name in ("list.ffconcat", "i%03d.jpg"):
            error, _, _ = refused(f"{origin.base}/{name}")
            assert "not a video stream this server reads" in error
        assert not any(".ts" in line or ".jpg" in line for line in origin.log)  # their files never asked for
        # The command line reads it, but FFmpeg's safe mode refuses a URL in it: said as such.
        (tmp_path / "abs.ffconcat").write_text(f"ffconcat version 1.0\nfile {origin.base}/vod0.ts\n")
        reader = NetworkReader(f"{origin.base}/abs.ffconcat", 1.0)
        reader.start()
        with pytest.raises(StreamError, match="safe mode refused a file the stream names") as failed:
            reader.wait_open()
    assert "authentication" not in str(failed.value)
