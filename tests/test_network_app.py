"""The app's Live URL source through its API (/start_url, /metrics), against a loopback RTSP server:
allowed only with --allow-urls, credentials never shown, one clear error for what cannot open."""

from __future__ import annotations

import json

import pytest
from gradio_client import Client
from gradio_client.exceptions import AppError

from app import parse_args
from hermes.serving import StreamRegistry, UrlPolicy
from tests.helpers import wait_for
from tests.network_servers import free_port, rtsp_server
from tests.test_network_serving import LIVE
from ui import build_app, launch_options

pytestmark = pytest.mark.timeout(180)


def serve(lm, urls: UrlPolicy):
    registry = StreamRegistry(lm, settings=LIVE)
    demo = build_app(lm, registry=registry, urls=urls)
    demo.launch(
        server_name="127.0.0.1",
        server_port=free_port(),
        prevent_thread_lock=True,
        quiet=True,
        **launch_options(),
    )
    return demo, registry


@pytest.fixture(scope="module")
def rtsp():
    with rtsp_server(credentials="ann:s3cret") as server:
        yield server


def test_the_allow_urls_option():
    assert UrlPolicy.parse(parse_args([]).allow_urls) == UrlPolicy()
    assert UrlPolicy.parse(parse_args(["--allow-urls"]).allow_urls) == UrlPolicy(True, ())
    named = parse_args(["--allow-urls", "cam.local,10.0.0.0/8"]).allow_urls
    assert UrlPolicy.parse(named) == UrlPolicy(True, ("cam.local", "10.0.0.0/8"))


def test_a_live_url_through_the_api(llava_lm, rtsp):
    demo, registry = serve(llava_lm, UrlPolicy.parse("127.0.0.1"))
    client = Client(demo.local_url, verbose=False)
    try:
        with pytest.raises(AppError, match="connection refused"):
            client.predict(f"rtsp://127.0.0.1:{free_port()}/cam", api_name="/start_url")
        with pytest.raises(AppError, match="scheme 'file'"):
            client.predict("file:///etc/passwd", api_name="/start_url")
        status, chat = client.predict(rtsp.url, api_name="/start_url")
        assert "rtsp://***@127.0.0.1" in status and "s3cret" not in status and chat == []
        metrics = wait_for(lambda: (m := client.predict(api_name="/metrics"))["chunks"] >= 2 and m)
        assert metrics["network"]["link"] == "streaming" and metrics["network"]["latency_s"] >= 0
        assert "s3cret" not in json.dumps(metrics)
        final = client.predict("What moves?", api_name="/ask")[0]
        assert final[-1]["role"] == "assistant" and "TTFT" in str(final[-1]["content"])
        client.predict(api_name="/stop")
    finally:
        client.close()
        demo.close()
        registry.shutdown()


def test_an_app_without_allow_urls_opens_no_stream(llava_lm, rtsp):
    demo, registry = serve(llava_lm, UrlPolicy())
    client = Client(demo.local_url, verbose=False)
    try:
        with pytest.raises(AppError, match="--allow-urls"):
            client.predict(rtsp.url, api_name="/start_url")
        client.predict("Cockatoo, close-up (14 s)", "max", api_name="/start_sample")  # the app goes on
        assert wait_for(lambda: client.predict(api_name="/metrics")["frames_seen"] > 0)
    finally:
        client.close()
        demo.close()
        registry.shutdown()
