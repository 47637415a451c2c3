// Package api is the coordinator's operator HTTP API: JSON over net/http,
// described by proto/openapi.yaml.
//
// Every route needs a bearer token whose role (viewer < operator < admin)
// is at least the route's; the route table below is the single source of
// the routes, their roles and whether they write. The exceptions are the
// public routes (public.go): /healthz, /readyz and the OpenAPI document. Writes reaching a
// follower are relayed to the leader, again to a new leader only where
// that is safe (forward.go); reads are served from the local replica
// (stale) unless ?consistent=true asks for a Raft barrier, and never from
// a replica that has not caught up since it started or has not applied
// ?min_index (freshness.go). Every request has a deadline (timeouts.go).
// Lists are blocking queries (?index=N&wait=30s) and every read returns
// X-Gpuaas-Index. Errors are application/problem+json bodies with
// a stable proto.Code. A refused request changes nothing: validation runs
// before any command is proposed.
package api

import (
	"context"
	"log/slog"
	"net/http"
	"slices"

	"github.com/gpuaas/gpuaas/coordinator/metrics"
	"github.com/gpuaas/gpuaas/coordinator/server"
	"github.com/gpuaas/gpuaas/coordinator/state"
	"github.com/gpuaas/gpuaas/proto"
)

// Backend is the part of a coordinator replica (*server.Server) the API
// uses. Tests run the API against a real single-node server or an
// in-process ledger.
type Backend interface {
	// Store is the local replica's ledger (it changes after a snapshot
	// restore: always call it, never cache).
	Store() *state.Store
	// Apply proposes one command; a follower returns an error whose code
	// is proto.CodeNotLeader.
	Apply(ctx context.Context, t proto.MessageType, req any) (any, uint64, error)
	// Place plans and commits one allocation (leader only).
	Place(ctx context.Context, req proto.AllocationCreateRequest, idemKey string) (proto.Allocation, bool, error)
	IsLeader() bool
	// LeaderHTTPAddr is the leader's API address, "" when unknown.
	LeaderHTTPAddr() string
	// Barrier waits until everything committed before it is applied
	// locally (leader only).
	Barrier(ctx context.Context) error
	Peers() ([]Peer, error)
	AddVoter(ctx context.Context, id, raftAddr, httpAddr string) error
	RemoveServer(ctx context.Context, id string) error
	TransferLeadership(ctx context.Context, id string) error
}

// A coordinator replica is a Backend as is.
var _ Backend = (*server.Server)(nil)

// Peer is one server of the Raft configuration.
type Peer = server.Peer

// Route is one entry of the route table.
type Route struct {
	Method  string
	Pattern string // net/http pattern path, also the OpenAPI path
	Role    Role   // minimum role
	Write   bool   // proposes a command: forwarded to the leader
	handle  func(*call) error
}

// API serves the operator API.
type API struct {
	b      Backend
	auth   Authenticator
	log    *slog.Logger
	skus   []proto.SKU
	mux    *http.ServeMux
	routes []Route
	proxy  *forwarder
	leases leaseMemo // last lease comparison per node (leasedrift.go)
	guard  *guard    // rate limits, lockout, body timeout (limits.go); nil: none
	peers  peerIPs   // the peers' IPs, whose forwarded requests are not limited
	// refused counts refusals for the audit log (refusals.go).
	refused refusals
	// caSeen is the CA bundle version each agent reported (ca.go).
	caSeen caSeen

	consoles    consoleGateway   // console sessions on this replica (console.go)
	appProxy    appProxyHub      // agents' parked workload proxy connections (appproxy.go)
	metrics     *metrics.Metrics // the replica's (metrics.go)
	metricsHTTP http.Handler     // GET /v1/metrics
}

// New returns the operator API handler over backend b.
func New(b Backend, auth Authenticator, log *slog.Logger) *API {
	if log == nil {
		log = slog.Default()
	}
	a := &API{b: b, auth: auth, log: log, skus: proto.DefaultSKUs(), mux: http.NewServeMux()}
	a.proxy = newForwarder(log, b)
	a.consoles.recorder = raftConsoleRecorder{b: b, log: log}
	a.metrics = metricsOf(b)
	a.registerAppProxyMetrics()
	a.metricsHTTP = a.newMetricsHandler()
	a.routes = append(append(append(a.routeTable(), a.imageRoutes()...), a.appRoutes()...), a.appInstanceRoutes()...)
	a.routes = append(a.routes, a.appProxyRoutes()...)
	allowed := map[string][]string{}
	for _, rt := range a.routes {
		if rt.Pattern == AppProxyPattern {
			a.mux.Handle(rt.Method+" "+appProxyMuxPattern, a.instrument(rt.Method, AppProxyPattern, a.appProxyHandler()))
			continue
		}
		if isBlobRoute(rt) {
			a.mux.Handle(rt.Method+" "+rt.Pattern, a.instrument(rt.Method, rt.Pattern, a.blobHandler(rt)))
			allowed[rt.Pattern] = append(allowed[rt.Pattern], rt.Method)
			continue
		}
		a.mux.Handle(rt.Method+" "+rt.Pattern, a.instrument(rt.Method, rt.Pattern, a.wrap(rt)))
		allowed[rt.Pattern] = append(allowed[rt.Pattern], rt.Method)
	}
	for _, rt := range a.publicRoutes() {
		a.mux.Handle(rt.Method+" "+rt.Pattern, a.instrument(rt.Method, rt.Pattern, rt.handle))
		allowed[rt.Pattern] = append(allowed[rt.Pattern], rt.Method)
	}
	a.registerAgentRoutes()
	// The same paths with another method answer 405 with Allow. Each
	// method is registered on its own (not one method-less pattern), so
	// a literal segment like /v1/apps/{name}/targets (GET) can sit beside
	// a wildcard one like /v1/apps/{name}/{version} (PUT, GET).
	for p, methods := range allowed {
		for _, m := range []string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete, http.MethodOptions} {
			if slices.Contains(methods, m) || m == http.MethodHead && slices.Contains(methods, http.MethodGet) {
				continue
			}
			a.mux.Handle(m+" "+p, a.methodNotAllowed(methods))
		}
	}
	a.mux.Handle("/", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		writeProblem(w, r, proto.Errorf(proto.CodeNotFound, "no route %s %s", r.Method, r.URL.Path))
	}))
	return a
}

// Routes returns the route table (for contract tests and docs).
func (a *API) Routes() []Route { return append([]Route(nil), a.routes...) }

// ServeHTTP implements http.Handler.
func (a *API) ServeHTTP(w http.ResponseWriter, r *http.Request) { a.serve(w, r) }

func (a *API) routeTable() []Route {
	return []Route{
		{http.MethodPost, "/v1/allocations", RoleOperator, true, a.createAllocation},
		{http.MethodGet, "/v1/allocations", RoleViewer, false, a.listAllocations},
		{http.MethodGet, "/v1/allocations/{id}", RoleViewer, false, a.getAllocation},
		{http.MethodPost, "/v1/allocations/{id}/release", RoleOperator, true, a.releaseAllocation},
		{http.MethodPost, "/v1/allocations/{id}/force-release", RoleAdmin, true, a.forceReleaseAllocation},
		{http.MethodGet, "/v1/allocations/{id}/timeline", RoleViewer, false, a.getTimeline},
		{http.MethodGet, "/v1/allocations/{id}/claims", RoleViewer, false, a.getClaims},
		{http.MethodGet, "/v1/allocations/{id}/tasks", RoleViewer, false, a.listAllocationTasks},
		{http.MethodGet, "/v1/allocations/{id}/ingress", RoleViewer, false, a.getIngress},
		{http.MethodPost, "/v1/allocations/{id}/ingress", RoleOperator, true, a.addIngress},
		{http.MethodDelete, "/v1/allocations/{id}/ingress/{protocol}/{port}", RoleOperator, true, a.removeIngress},
		{http.MethodGet, "/v1/allocations/{id}/console", RoleViewer, false, a.console},
		{http.MethodGet, "/v1/allocations/{id}/console/sessions", RoleViewer, false, a.consoleSessions},
		{http.MethodGet, "/v1/allocations/{id}/console/sessions/{session}/transcript", RoleViewer, false, a.consoleTranscript},

		{http.MethodGet, "/v1/nodes", RoleViewer, false, a.listNodes},
		{http.MethodGet, "/v1/nodes/{id}", RoleViewer, false, a.getNode},
		{http.MethodPost, "/v1/nodes/{id}/drain", RoleAdmin, true, a.drainNode(true)},
		{http.MethodPost, "/v1/nodes/{id}/undrain", RoleAdmin, true, a.drainNode(false)},
		{http.MethodPost, "/v1/nodes/{id}/breaker/reset", RoleAdmin, true, a.resetBreaker},
		{http.MethodPut, "/v1/nodes/{id}/intent", RoleAdmin, true, a.setIntent},
		{http.MethodGet, "/v1/nodes/{id}/topology", RoleViewer, false, a.getTopology},
		{http.MethodPost, "/v1/nodes/{id}/slots", RoleAdmin, true, a.approveSlot},
		{http.MethodGet, "/v1/nodes/{id}/tasks", RoleViewer, false, a.listNodeTasks},
		{http.MethodPost, "/v1/nodes/{id}/disks/ownership", RoleAdmin, true, a.approveDiskOwnership},

		{http.MethodGet, "/v1/slots", RoleViewer, false, a.listSlots},
		{http.MethodGet, "/v1/slots/{id}", RoleViewer, false, a.getSlot},
		{http.MethodPost, "/v1/slots/{id}/disable", RoleAdmin, true, a.disableSlot},
		{http.MethodPost, "/v1/slots/{id}/repair", RoleAdmin, true, a.repairSlot},
		{http.MethodPost, "/v1/slots/{id}/cleanup", RoleAdmin, true, a.cleanupSlot},

		{http.MethodGet, "/v1/regions", RoleViewer, false, a.listRegions},
		{http.MethodPut, "/v1/regions/{name}", RoleAdmin, true, a.putRegion},
		{http.MethodGet, "/v1/pools", RoleViewer, false, a.listPools},
		{http.MethodPut, "/v1/pools/{name}", RoleAdmin, true, a.putPool},

		{http.MethodPut, "/v1/sites/{name}", RoleAdmin, true, a.putSite},
		{http.MethodGet, "/v1/sites/{name}", RoleViewer, false, a.getSite},
		{http.MethodPut, "/v1/sites/{name}/ingress", RoleAdmin, true, a.putSiteIngress},
		{http.MethodPut, "/v1/sites/{name}/profiles/{profile}", RoleAdmin, true, a.putSiteProfile},
		{http.MethodGet, "/v1/sites/{name}/profiles/{profile}", RoleViewer, false, a.getSiteProfile},
		{http.MethodPost, "/v1/sites/{name}/onboard", RoleAdmin, true, a.onboard},
		{http.MethodPost, "/v1/sites/{name}/decommission", RoleAdmin, true, a.decommission},
		{http.MethodGet, "/v1/workflows", RoleViewer, false, a.listWorkflows},
		{http.MethodPost, "/v1/bundles", RoleAdmin, true, a.publishBundle},
		{http.MethodGet, "/v1/bundles", RoleViewer, false, a.listBundles},
		{http.MethodGet, "/v1/bundles/{digest}", RoleViewer, false, a.getBundle},
		{http.MethodGet, "/v1/workflows/{id}", RoleViewer, false, a.getWorkflow},

		{http.MethodGet, "/v1/availability", RoleViewer, false, a.getAvailability},
		{http.MethodGet, "/v1/usage", RoleViewer, false, a.getUsage},

		{http.MethodGet, "/v1/status", RoleViewer, false, a.getStatus},
		{http.MethodGet, "/v1/whoami", RoleViewer, false, a.whoami},
		{http.MethodGet, "/v1/metrics", RoleViewer, false, a.getMetrics},
		{http.MethodGet, "/v1/operator/peers", RoleViewer, false, a.listPeers},
		{http.MethodPost, "/v1/operator/peers", RoleAdmin, true, a.addPeer},
		{http.MethodDelete, "/v1/operator/peers/{id}", RoleAdmin, true, a.removePeer},
		{http.MethodPost, "/v1/operator/transfer-leadership", RoleAdmin, true, a.transferLeadership},
		{http.MethodPost, "/v1/operator/join-tokens", RoleAdmin, true, a.createJoinToken},
		{http.MethodGet, "/v1/operator/tokens", RoleViewer, false, a.listAPITokens},
		{http.MethodPost, "/v1/operator/tokens", RoleAdmin, true, a.createAPIToken},
		{http.MethodDelete, "/v1/operator/tokens/{name}", RoleAdmin, true, a.revokeAPIToken},

		{http.MethodGet, "/v1/audit", RoleAdmin, false, a.listAudit},
		{http.MethodGet, "/v1/audit/export", RoleAdmin, false, a.exportAudit},
		{http.MethodGet, "/v1/audit/verify", RoleAdmin, false, a.verifyAudit},
		{http.MethodPost, "/v1/audit/prune", RoleAdmin, true, a.pruneAudit},
		{http.MethodPost, "/v1/audit/ack", RoleAdmin, true, a.ackAuditExport},
		{http.MethodGet, "/v1/audit/retention", RoleAdmin, false, a.auditRetention},
	}
}

// A coordinator replica keeps the replicated API tokens.
var _ TokenBackend = (*server.Server)(nil)
