package api

import (
	"net/http"

	"github.com/gpuaas/gpuaas/proto"
)

// tenantAccess is how a tenant token may use a route.
type tenantAccess int

const (
	// tenantCatalog: the route reads the catalog (images, regions, pools,
	// availability) and answers a tenant as it answers a viewer.
	tenantCatalog tenantAccess = iota + 1
	// tenantOwnList: a list the handler filters to the tenant's own
	// objects (c.ownerScope).
	tenantOwnList
	// tenantOwnAllocation: the path's {id} must be an allocation the
	// tenant owns; any other answers 404 exactly as a missing one does,
	// so a tenant learns nothing of others' allocations.
	tenantOwnAllocation
	// tenantCreate: the create route, whose handler records the caller as
	// the owner and refuses another owner below role admin.
	tenantCreate
)

// tenantRoutes is every route a tenant token may use ("METHOD pattern");
// every other route (nodes, slots, tasks, sites, peers, status, metrics,
// and any route added later until it is listed here) answers a tenant
// 403.
var tenantRoutes = map[string]tenantAccess{
	"POST /v1/allocations":              tenantCreate,
	"GET /v1/allocations":               tenantOwnList,
	"GET /v1/allocations/{id}":          tenantOwnAllocation,
	"POST /v1/allocations/{id}/release": tenantOwnAllocation,
	"GET /v1/allocations/{id}/timeline": tenantOwnAllocation,
	"GET /v1/allocations/{id}/claims":   tenantOwnAllocation,
	"GET /v1/allocations/{id}/tasks":    tenantOwnAllocation,
	// The serial console of the tenant's own slice, and its sessions
	// (transcripts are for admins).
	"GET /v1/allocations/{id}/console":          tenantOwnAllocation,
	"GET /v1/allocations/{id}/console/sessions": tenantOwnAllocation,
	"GET /v1/usage":                   tenantOwnList,
	"GET /v1/images":                  tenantCatalog,
	"GET /v1/images/{name}/{version}": tenantCatalog,
	"GET /v1/regions":                 tenantCatalog,
	"GET /v1/pools":                   tenantCatalog,
	"GET /v1/availability":            tenantCatalog,
	// The app catalog, and the target picker over the tenant's own
	// allocations (its handler judges the caller's allocations only; a
	// role below admin may not name another owner).
	"GET /v1/whoami":                           tenantCatalog, // what this token may call (the web console's controls)
	"GET /v1/apps":                             tenantCatalog,
	"GET /v1/apps/{name}/{version}":            tenantCatalog,
	"GET /v1/apps/{name}/targets":              tenantCatalog,
	"GET /v1/allocations/{id}/apps/compatible": tenantOwnAllocation,
	// Launching, watching and stopping apps on the tenant's own
	// allocations, and reaching them through the workload proxy.
	"POST /v1/allocations/{id}/apps":            tenantOwnAllocation,
	"GET /v1/allocations/{id}/apps":             tenantOwnAllocation,
	"GET /v1/allocations/{id}/apps/{app}":       tenantOwnAllocation,
	"GET /v1/allocations/{id}/apps/{app}/logs":  tenantOwnAllocation,
	"POST /v1/allocations/{id}/apps/{app}/stop": tenantOwnAllocation,
}

func init() {
	for _, m := range AppProxyMethods {
		tenantRoutes[m+" "+AppProxyPattern] = tenantOwnAllocation
	}
}

// TenantAccess reports whether a tenant token may use the route (for the
// contract test and docs).
func TenantAccess(method, pattern string) bool {
	_, ok := tenantRoutes[method+" "+pattern]
	return ok
}

// authorizeTenant is authorize's check for a tenant principal: the route
// must be in tenantRoutes, and a route on one allocation needs the
// allocation to be the tenant's. It has written the answer when it
// returns false.
func (a *API) authorizeTenant(w http.ResponseWriter, r *http.Request, rt Route, p Principal) bool {
	access, ok := tenantRoutes[rt.Method+" "+rt.Pattern]
	if !ok {
		writeProblem(w, r, proto.Errorf(proto.CodeForbidden, "%s %s is not open to tenant tokens (token %s has role tenant: its own allocations and the catalog only)", rt.Method, rt.Pattern, p.Name))
		return false
	}
	if access != tenantOwnAllocation {
		return true
	}
	id := r.PathValue("id")
	if proto.ValidateID("allocation id", id) != nil {
		return true // the handler answers 400 naming what is wrong
	}
	al, found := a.b.Store().Snapshot().Allocation(id)
	if found && al.Owner == p.Name {
		return true
	}
	if !a.b.IsLeader() && r.Header.Get(proto.ForwardedHeader) == "" {
		// An allocation created a moment ago may not have reached this
		// replica yet: the leader, which placed it, decides. Another
		// owner's goes the same way, so the answer's timing does not
		// tell it from a missing one.
		c := &call{a: a, w: w, r: r, rt: rt, p: p}
		if c.body, ok = readBody(w, r); ok {
			a.forward(c, nil)
		}
		return false
	}
	// The same answer as for an allocation that does not exist.
	writeProblem(w, r, errNoAllocation(id))
	return false
}

// errNoAllocation is the one answer for an allocation the caller may not
// see, whether it exists or not.
func errNoAllocation(id string) error {
	return proto.Errorf(proto.CodeNotFound, "allocation %s does not exist", id)
}

// ownerScope is the owner a list is limited to: the principal's name for
// a tenant, "" (everyone's) for the other roles.
func (c *call) ownerScope() string {
	if c.p.Role == RoleTenant {
		return c.p.Name
	}
	return ""
}
