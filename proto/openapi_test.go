package proto

import (
	"encoding/json"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The JSON rendering is the same document as the YAML: both load, with
// the same paths, operations and schemas.
func TestOpenAPIJSONIsTheYAMLDocument(t *testing.T) {
	t.Parallel()
	js, err := OpenAPIJSON()
	require.NoError(t, err)
	require.True(t, json.Valid(js))

	fromYAML, err := openapi3.NewLoader().LoadFromData(OpenAPI())
	require.NoError(t, err)
	fromJSON, err := openapi3.NewLoader().LoadFromData(js)
	require.NoError(t, err)
	require.NoError(t, fromJSON.Validate(openapi3.NewLoader().Context))

	assert.Equal(t, fromYAML.Info.Title, fromJSON.Info.Title)
	assert.Equal(t, len(fromYAML.Paths.Map()), len(fromJSON.Paths.Map()))
	for p, item := range fromYAML.Paths.Map() {
		other := fromJSON.Paths.Value(p)
		require.NotNil(t, other, p)
		for m, op := range item.Operations() {
			o := other.GetOperation(m)
			require.NotNil(t, o, "%s %s", m, p)
			assert.Equal(t, op.OperationID, o.OperationID)
			assert.Equal(t, op.Extensions, o.Extensions, "%s %s", m, p)
		}
	}
	assert.Equal(t, len(fromYAML.Components.Schemas), len(fromJSON.Components.Schemas))

	// Callers get their own copy.
	js[0] = 'X'
	again, err := OpenAPIJSON()
	require.NoError(t, err)
	assert.Equal(t, byte('{'), again[0])
}

func TestYAMLToJSON(t *testing.T) {
	t.Parallel()
	got, err := yamlToJSON([]byte("a:\n  200: ok\n  b: [1, {c: true}]\n"))
	require.NoError(t, err)
	assert.JSONEq(t, `{"a":{"200":"ok","b":[1,{"c":true}]}}`, string(got))

	_, err = yamlToJSON([]byte("a:\n  ~: 1\n  b: 2\n"))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "is not a scalar")

	_, err = yamlToJSON([]byte("a: [\n"))
	require.ErrorContains(t, err, "parse OpenAPI YAML")
}
