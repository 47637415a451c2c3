package api

import (
	"context"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/proto"
)

// TestAgentRoutesMatchTheirDocument checks that every agent-protocol route
// the API serves is in proto/agent-openapi.yaml, and the reverse.
func TestAgentRoutesMatchTheirDocument(t *testing.T) {
	doc, err := openapi3.NewLoader().LoadFromData(proto.AgentOpenAPI())
	require.NoError(t, err)
	require.NoError(t, doc.Validate(context.Background()))
	served := map[string]bool{}
	for _, r := range AgentRoutes() {
		key := strings.ToLower(r.Method) + " " + r.Pattern
		served[key] = true
		item := doc.Paths.Find(r.Pattern)
		require.NotNil(t, item, "%s is not in agent-openapi.yaml", r.Pattern)
		assert.NotNil(t, item.GetOperation(r.Method), "%s %s is not in agent-openapi.yaml", r.Method, r.Pattern)
	}
	for path, item := range doc.Paths.Map() {
		for method := range item.Operations() {
			assert.True(t, served[strings.ToLower(method)+" "+path], "%s %s is documented but not served", method, path)
		}
	}
}
