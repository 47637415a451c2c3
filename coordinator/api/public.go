package api

import (
	"encoding/json"
	"net/http"

	"github.com/gpuaas/gpuaas/proto"
)

// PublicRoute is an unauthenticated route: the liveness and readiness
// probes and the OpenAPI document. They change nothing, read no ledger
// data and take no query parameters.
type PublicRoute struct {
	Method  string
	Pattern string
	handle  http.HandlerFunc
}

// ReadinessReporter is the part of a Backend that says whether the
// replica is caught up (*server.Server implements it). A backend without
// it is ready whenever a leader is known.
type ReadinessReporter interface {
	Readiness() (ready bool, reason string)
}

// PublicRoutes returns the unauthenticated routes (for contract tests).
func (a *API) PublicRoutes() []PublicRoute { return a.publicRoutes() }

func (a *API) publicRoutes() []PublicRoute {
	return []PublicRoute{
		{http.MethodGet, "/healthz", a.healthz},
		{http.MethodGet, "/readyz", a.readyz},
		{http.MethodGet, "/v1/openapi.json", a.openAPIJSON},
		{http.MethodGet, "/v1/openapi.yaml", a.openAPIYAML},
	}
}

// Health is the /healthz body.
type Health struct {
	Status string `json:"status"`
}

// ReplicaReadiness is the /readyz body.
type ReplicaReadiness struct {
	Status string `json:"status"` // ready or not_ready
	Reason string `json:"reason,omitempty"`
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func (a *API) healthz(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, Health{Status: "ok"})
}

// readiness asks the backend, or, for a backend that cannot say, whether
// a leader is known.
func (a *API) readiness() (bool, string) {
	if rr, ok := a.b.(ReadinessReporter); ok {
		return rr.Readiness()
	}
	if a.b.IsLeader() || a.b.LeaderHTTPAddr() != "" {
		return true, ""
	}
	return false, "no leader is known"
}

func (a *API) readyz(w http.ResponseWriter, _ *http.Request) {
	if ok, why := a.readiness(); !ok {
		writeJSON(w, http.StatusServiceUnavailable, ReplicaReadiness{Status: "not_ready", Reason: why})
		return
	}
	writeJSON(w, http.StatusOK, ReplicaReadiness{Status: "ready"})
}

func (a *API) openAPIJSON(w http.ResponseWriter, r *http.Request) {
	b, err := proto.OpenAPIJSON()
	if err != nil {
		a.log.Error("render the OpenAPI document as JSON", "err", err)
		writeProblem(w, r, proto.Errorf(proto.CodeInternal, "render the OpenAPI document"))
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(b)
}

func (a *API) openAPIYAML(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/yaml")
	_, _ = w.Write(proto.OpenAPI())
}
