// gpuaas web console: the serial console page. xterm.js (vendored,
// LICENSE.xterm) renders the terminal; the WebSocket is the console's
// /ui/allocations/{id}/console/ws, which is the API's console gateway
// reached with the session's token. Binary frames are terminal bytes both
// ways; text frames from the gateway are JSON control messages
// ({type: attached|notice|closed|error, mode, reason}).
(function () {
  "use strict";
  var el = document.getElementById("terminal");
  if (!el || typeof Terminal === "undefined") return;
  var status = document.getElementById("console-status");
  var modeEl = document.getElementById("console-mode");
  var form = document.getElementById("console-form");
  var connectBtn = document.getElementById("console-connect");
  var disconnectBtn = document.getElementById("console-disconnect");
  var readOnly = document.getElementById("console-readonly");
  var reason = document.getElementById("console-reason");

  var term = new Terminal({ cursorBlink: true, fontSize: 14, scrollback: 5000, convertEol: false,
    fontFamily: "ui-monospace, SFMono-Regular, Menlo, monospace" });
  var fit = new FitAddon.FitAddon();
  term.loadAddon(fit);
  term.open(el);
  try { fit.fit(); } catch (e) { /* not laid out yet */ }
  window.addEventListener("resize", function () { try { fit.fit(); } catch (e) {} });

  var ws = null;
  var enc = new TextEncoder();

  function setStatus(state, text) {
    status.dataset.state = state;
    status.textContent = text;
  }
  function setMode(mode) {
    modeEl.dataset.mode = mode;
    modeEl.textContent = mode === "read-only" ? (readOnly && readOnly.checked ? "read-only: watching, as asked" :
      "read-only: another session holds the console read-write") :
      mode === "read-write" ? "read-write" : "";
    modeEl.className = "pill" + (mode === "read-only" ? " warn" : "");
  }

  function connect() {
    if (ws) return;
    if (reason && !reason.value.trim()) {
      setStatus("closed", "give a reason first: you do not own this allocation, and the session is audited");
      return;
    }
    var u = new URL(el.dataset.ws, location.href);
    u.protocol = location.protocol === "https:" ? "wss:" : "ws:";
    if (readOnly && readOnly.checked) u.searchParams.set("read_only", "true");
    if (reason && reason.value.trim()) u.searchParams.set("reason", reason.value.trim());
    setStatus("connecting", "connecting…");
    setMode("");
    var sock = new WebSocket(u.toString());
    sock.binaryType = "arraybuffer";
    ws = sock;
    connectBtn.disabled = true;
    disconnectBtn.disabled = false;
    sock.onmessage = function (ev) {
      if (typeof ev.data === "string") {
        var ctl;
        try { ctl = JSON.parse(ev.data); } catch (e) { return; }
        if (ctl.type === "attached") {
          setStatus("attached", "connected" + (ctl.session ? " (" + ctl.session + ")" : ""));
          setMode(ctl.mode || "");
          term.focus();
        } else if (ctl.type === "notice") {
          term.write("\r\n\x1b[33m[console: " + (ctl.reason || "notice") + "]\x1b[0m\r\n");
        } else if (ctl.type === "closed" || ctl.type === "error") {
          setStatus("closed", "closed: " + (ctl.reason || ctl.type));
        }
        return;
      }
      term.write(new Uint8Array(ev.data));
    };
    sock.onclose = function (ev) {
      if (ws === sock) ws = null;
      connectBtn.disabled = false;
      disconnectBtn.disabled = true;
      if (status.dataset.state !== "closed") {
        setStatus("closed", ev.reason ? "closed: " + ev.reason :
          (ev.code === 1006 ? "refused or cut (see the sessions below; is the slice active and yours?)" : "closed"));
      }
    };
  }

  term.onData(function (d) {
    if (ws && ws.readyState === WebSocket.OPEN) ws.send(enc.encode(d));
  });
  term.onBinary(function (d) {
    if (!ws || ws.readyState !== WebSocket.OPEN) return;
    var b = new Uint8Array(d.length);
    for (var i = 0; i < d.length; i++) b[i] = d.charCodeAt(i) & 255;
    ws.send(b);
  });
  form.addEventListener("submit", function (ev) { ev.preventDefault(); connect(); });
  disconnectBtn.addEventListener("click", function () { if (ws) ws.close(1000, "closed in the web console"); });

  // For tests and screen readers: the terminal's text, line by line.
  window.gpuaasConsoleText = function () {
    var b = term.buffer.active, out = [];
    for (var i = 0; i < b.length; i++) {
      var l = b.getLine(i);
      if (l) out.push(l.translateToString(true));
    }
    return out.join("\n");
  };
  if (el.dataset.autoconnect) connect();
})();
