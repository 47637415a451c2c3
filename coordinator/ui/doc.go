// Package ui is the web console every coordinator serves under /ui/: a
// tenant's H200 launch wizard, allocation pages, serial console and apps,
// and an operator's inventory (overview, nodes, slots, images). Pages are
// server-rendered html/template with htmx (vendored under static/, 0BSD,
// see static/LICENSE.htmx) for the live parts, and xterm.js (MIT,
// static/LICENSE.xterm) on the serial console page only; the vendored
// files are pinned in static/VENDOR.sums. Everything is embedded in the
// binary, nothing is loaded from elsewhere, so the console works
// air-gapped.
//
// # No back door
//
// The console holds no ledger and no logic of its own: every read and
// write is a call to the operator API, made in process through the very
// http.Handler the coordinator serves /v1/ with (api.API, wrapped in the
// same middleware), carrying the signed-in user's own bearer token and the
// browser's remote address (the client is a coordinator/cli Client whose
// transport calls that handler). Authentication, the role check
// (authorize), rate limits, the request log, the forwarding of writes to
// the leader and the strict request validation are therefore exactly the
// CLI's. A viewer's forged POST reaches the API as that viewer and is
// refused there with 403. Which write controls a page shows comes from GET
// /v1/whoami, which lists the routes the caller's role may call using the
// same rule authorize applies; hiding a control is a courtesy, the API's
// refusal is the enforcement.
//
// # Sessions
//
// Signing in checks the API token with /v1/whoami and puts it in a
// session cookie sealed with AES-256-GCM under the console's session key
// (-ui-session-key-file, 64 hex digits, the same file on every replica):
// any coordinator behind a load balancer opens it, and nothing is stored
// server-side. Without a key file each coordinator makes a random key at
// start, so a session works only on the coordinator that issued it and
// ends when it restarts. The cookie is HttpOnly, SameSite=Strict, Secure
// when the request came over TLS, scoped to /ui/ and expires after the
// session TTL (the sealed expiry is checked, not the browser's). Signing
// out clears it; as the session is the token, revoking the token ends it.
//
// # CSRF
//
// Every state-changing request is a POST carrying the session's CSRF
// token (random per session, sealed in the cookie) as the form field
// csrf; a POST without it, with a wrong one, or with an Origin header of
// another host is refused with 403 before the API is called. The sign-in
// form uses a short-lived pre-session cookie the same way.
//
// # Read-your-writes and live pages
//
// A write's answer carries X-Gpuaas-Index; the console redirects to the
// page with ?index=N and that page's first read is a blocking query at
// N-1, so it shows the write on whichever coordinator serves it. Pages
// showing something in progress (an allocation being provisioned or
// released) re-render their live part with htmx long-polls: each poll is
// an API blocking query on the allocation's tasks from the last index
// seen (a stage event or a byte-progress report rewrites the task).
// Smaller live cards poll a fragment of their own on an interval: a
// console page's recent sessions (every 5 s), an allocation's running
// apps while an instance is pending, starting or stopping (every 3 s).
//
// # Serial console and apps
//
// The console page's WebSocket and an app's Open link cannot carry a
// bearer token, and the session cookie is scoped to /ui/: console.go and
// apps.go hand those requests to the API handler in process with the
// session's token instead of the cookie (after a same-origin check), so
// the API's console gateway and workload proxy decide and record them.
package ui
