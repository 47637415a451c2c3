package api

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/proto"
	"github.com/gpuaas/gpuaas/proto/prototest"
)

func TestOnboardAndReadWorkflow(t *testing.T) {
	t.Parallel()
	e, _ := siteEnv(t)
	require.Equal(t, http.StatusOK, e.do(RoleAdmin, http.MethodPut, "/v1/sites/site-a", siteBody()).status)
	require.Equal(t, http.StatusOK, e.do(RoleAdmin, http.MethodPut, "/v1/sites/site-a/profiles/slice", prototest.SiteProfile()).status)
	body := proto.OnboardBody{Profile: "slice", Hostname: "j22u15", MACs: []string{"52:54:00:00:00:15"}, BMCAddress: "10.0.0.15", PowerType: "ipmi"}
	r := e.do(RoleAdmin, http.MethodPost, "/v1/sites/site-a/onboard", body)
	require.Equal(t, http.StatusCreated, r.status, "%s", r.body)
	var v proto.WorkflowView
	r.decode(t, &v)
	assert.Equal(t, "onboard.site-a.j22u15", v.ID)
	assert.Equal(t, proto.StageResolve, v.Stage)
	require.Len(t, v.Timeline, 12, "all twelve buckets are listed")
	assert.False(t, v.Timeline[0].Measured)

	again := e.do(RoleAdmin, http.MethodPost, "/v1/sites/site-a/onboard", body)
	assert.Equal(t, http.StatusOK, again.status, "the same machine again is its workflow")

	g := e.do(RoleViewer, http.MethodGet, "/v1/workflows/onboard.site-a.j22u15", nil)
	require.Equal(t, http.StatusOK, g.status, "%s", g.body)
	l := e.do(RoleViewer, http.MethodGet, "/v1/workflows?site=site-a&state=running", nil)
	require.Equal(t, http.StatusOK, l.status, "%s", l.body)
	var page proto.List[*proto.MAASWorkflow]
	l.decode(t, &page)
	require.Len(t, page.Items, 1)

	e.do(RoleOperator, http.MethodPost, "/v1/sites/site-a/onboard", body).requireProblem(t, http.StatusForbidden, proto.CodeForbidden)
	bad := body
	bad.MACs = []string{"not-a-mac"}
	e.do(RoleAdmin, http.MethodPost, "/v1/sites/site-a/onboard", bad).requireProblem(t, http.StatusBadRequest, proto.CodeInvalidArgument)
	other := body
	other.Profile = "bm"
	e.do(RoleAdmin, http.MethodPost, "/v1/sites/site-a/onboard", other).requireProblem(t, http.StatusNotFound, proto.CodeNotFound)
	e.do(RoleViewer, http.MethodGet, "/v1/workflows/onboard.site-a.nope", nil).requireProblem(t, http.StatusNotFound, proto.CodeNotFound)
	e.do(RoleViewer, http.MethodGet, "/v1/workflows?state=bogus", nil).requireProblem(t, http.StatusBadRequest, proto.CodeInvalidArgument)

	d := e.do(RoleAdmin, http.MethodPost, "/v1/sites/site-a/decommission", proto.DecommissionBody{Profile: "slice", Hostname: "j22u15"})
	require.Equal(t, http.StatusCreated, d.status, "%s", d.body)
	var dv proto.WorkflowView
	d.decode(t, &dv)
	assert.Equal(t, proto.WorkflowDecommission, dv.Kind)
	assert.Equal(t, proto.ReleaseFullDecommission, dv.ReleaseMode, "the profile's mode")
	assert.Equal(t, proto.StageRelease, dv.Stage)
	e.do(RoleAdmin, http.MethodPost, "/v1/sites/site-a/decommission", proto.DecommissionBody{Profile: "nope", Hostname: "j22u15"}).requireProblem(t, http.StatusNotFound, proto.CodeNotFound)
}
