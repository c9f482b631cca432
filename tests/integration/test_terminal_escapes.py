"""What a server says reaches the terminal as text: escape sequences in its model name or its
error answers are shown (``\\x1b``), never acted on (a recoloured, retitled or cleared terminal),
and a scenario's name is one line of text."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

from tests.helpers.rawserver import RawServer

ROOT = Path(__file__).parents[2]
MODEL = "m\x1b]0;pwned\x07\x1b[2J"  # sets the window title, clears the screen
ERROR = "bad request \x1b[31mred\x1b[0m \x9b2J"  # a colour, and the one-byte CSI


class Hostile(RawServer):
    def serve(self, conn: socket.socket) -> None:
        head = conn.recv(65536)
        if b"/models" in head.split(b"\r\n")[0]:
            body = json.dumps({"object": "list", "data": [{"id": MODEL, "object": "model"}]}).encode()
            status = b"200 OK"
        else:
            body = ERROR.encode()  # as a proxy answers: plain text
            status = b"400 Bad Request"
        conn.sendall(b"HTTP/1.1 %s\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s" % (status, len(body), body))


def test_a_servers_escape_sequences_are_shown_not_acted_on(tmp_path: Path) -> None:
    server = Hostile()
    try:
        proc = subprocess.run([sys.executable, "-m", "loadgen", "run", "--base-url", server.base_url,
                               "--num-prompts", "2", "--out", str(tmp_path / "run")],
                              capture_output=True, cwd=ROOT, timeout=120, check=False)
    finally:
        server.close()
    shown = proc.stdout + proc.stderr
    assert proc.returncode == 3, shown  # every request refused: the server cannot serve the scenario
    assert b"\x1b" not in shown, shown
    assert b"\xc2\x9b" not in shown, shown
    assert b"bad request \\x1b[31mred\\x1b[0m \\x9b2J" in shown  # the server's words, its escapes visible


def test_a_scenario_name_of_more_than_one_line_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text('name: "run\\n# injected heading"\ntarget: {base_url: "http://127.0.0.1:9/v1"}\n')
    proc = subprocess.run([sys.executable, "-m", "loadgen", "run", str(path)], capture_output=True, text=True,
                          cwd=ROOT, timeout=60, check=False)
    assert proc.returncode == 2, proc.stderr
    assert "name -> give one line of text, without line breaks or control characters" in proc.stderr
