// Package maassim is a MAAS 2.0 API simulator for the lab and for tests: an
// http.Handler serving /MAAS/api/2.0/ that a real MAAS client (the tests use
// github.com/canonical/gomaasclient, written against real MAAS) cannot tell
// from MAAS for the calls GPUaaS makes.
//
// What it reproduces from the MAAS source (canonical/maas):
//
//   - OAuth 1.0a PLAINTEXT with "consumer:token:secret" API keys
//     (maasserver/api/auth.py): 401 with "Authorization Error: ..." on a bad
//     key, nonce replay or stale timestamp; version/ is open.
//   - ?op= dispatch (maasserver/api/support.py): an unknown op is 400
//     "Unrecognised signature: method=POST op=frobnicate".
//   - NODE_STATUS codes and names and NODE_TRANSITIONS
//     (maasserver/node_status.py); a refused transition is a
//     NodeStateViolation: 409 text/plain with MAAS's wording ("Can't deploy a
//     machine that is in the 'Failed deployment' state").
//   - Error bodies: form errors are 400 application/json {"field": ["..."]};
//     other errors are text/plain. Transient transaction conflicts are 409
//     with Retry-After: 5 (maasserver/utils/views.py HttpResponseConflict);
//     rack unavailability is 503 with Retry-After: 10
//     (maasserver/middleware.py); an RPC timeout is 504.
//   - Events (maasserver/api/events.py): levels, newest first, status changes
//     as DEBUG "Node changed status" events, INFO stage events from the
//     provisioningserver event catalogue.
//
// Time is virtual (Clock): ManualClock for tests, ScaledClock for the lab.
// Faults are injected per machine (Server.InjectFault, or the admin endpoint
// under /_sim/). Every API request is kept in a request log with secrets
// redacted (Server.Requests). When a machine reaches Deployed,
// Options.OnDeployed receives it with the decoded cloud-init user_data it was
// deployed with, so the lab can boot that machine's agent through the same
// bootstrap path as a real host.
//
// See README.md for the fidelity limits.
package maassim
