#!/usr/bin/env python3
"""Screenshots a running node's dashboard with headless Chromium (for the README).

    python3 scripts/dashboard_screenshot.py http://127.0.0.1:8080/ docs/dashboard.png --wait 20

Drives Chromium over the DevTools protocol (the page keeps a server-sent-events stream open, so
`chromium --screenshot` never sees it finish loading); installs `websocket-client` from PyPI into
target/export-check-venv if it is missing.
"""

import argparse
import base64
import json
import os
import subprocess
import sys
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV = os.path.join(ROOT, "target", "export-check-venv")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("out")
    ap.add_argument("--wait", type=float, default=15.0, help="seconds to let the page fill")
    ap.add_argument("--size", default="1280,1000")
    a = ap.parse_args()
    try:
        import websocket  # noqa: F401
    except ImportError:
        py = os.path.join(VENV, "bin", "python")
        if not os.path.exists(py):
            subprocess.run([sys.executable, "-m", "venv", VENV], check=True)
        subprocess.run([py, "-m", "pip", "install", "--quiet", "websocket-client"], check=True)
        if os.path.realpath(sys.prefix) != os.path.realpath(VENV):
            os.execv(py, [py] + sys.argv)
        import websocket  # noqa: F401
    port = 9333
    chrome = subprocess.Popen(
        ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         f"--remote-debugging-port={port}", f"--window-size={a.size}", a.url],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        target = None
        for _ in range(100):
            try:
                pages = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list"))
                target = next(p for p in pages if p.get("type") == "page")
                break
            except Exception:
                time.sleep(0.1)
        if target is None:
            sys.exit("chromium did not open the page")
        time.sleep(a.wait)
        ws = websocket.create_connection(target["webSocketDebuggerUrl"], suppress_origin=True)
        ws.send(json.dumps({"id": 1, "method": "Page.captureScreenshot",
                            "params": {"format": "png"}}))
        while True:
            msg = json.loads(ws.recv())
            if msg.get("id") == 1:
                break
        with open(a.out, "wb") as f:
            f.write(base64.b64decode(msg["result"]["data"]))
        print(a.out)
    finally:
        chrome.kill()


if __name__ == "__main__":
    main()
