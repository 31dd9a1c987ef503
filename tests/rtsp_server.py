"""A loopback RTSP server for the tests: GStreamer's RTSP server (Debian's gir1.2-gst-rtsp-server-1.0)
serving a live test picture as H.264 at rtsp://127.0.0.1:PORT/cam, with PORT the first argument.

It runs under the system Python that has Debian's python3-gi (the tests start it as a subprocess),
and prints "ready" once it listens. Optional second argument: a user:password the server demands
(RTSP Basic authentication).
"""

from __future__ import annotations

import sys

import gi

gi.require_version("Gst", "1.0")
gi.require_version("GstRtspServer", "1.0")
from gi.repository import GLib, Gst, GstRtspServer  # noqa: E402

PIPELINE = (
    "( videotestsrc is-live=true pattern=ball ! video/x-raw,width=160,height=120,framerate=10/1 "
    "! x264enc tune=zerolatency speed-preset=ultrafast key-int-max=10 ! rtph264pay name=pay0 pt=96 config-interval=1 )"
)


def main() -> None:
    Gst.init(None)
    server = GstRtspServer.RTSPServer()
    server.set_address("127.0.0.1")
    server.set_service(sys.argv[1])
    factory = GstRtspServer.RTSPMediaFactory()
    factory.set_launch(PIPELINE)
    factory.set_shared(True)
    if len(sys.argv) > 2:
        user, password = sys.argv[2].split(":", 1)
        auth = GstRtspServer.RTSPAuth()
        token = GstRtspServer.RTSPToken()
        token.set_string("media.factory.role", user)
        auth.add_basic(GstRtspServer.RTSPAuth.make_basic(user, password), token)
        server.set_auth(auth)
        permissions = GstRtspServer.RTSPPermissions()
        permissions.add_permission_for_role(user, "media.factory.access", True)
        permissions.add_permission_for_role(user, "media.factory.construct", True)
        factory.set_permissions(permissions)
    server.get_mount_points().add_factory("/cam", factory)
    server.attach(None)
    print("ready", flush=True)
    GLib.MainLoop().run()


if __name__ == "__main__":
    main()
