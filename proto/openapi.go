package proto

import (
	_ "embed"
	"encoding/json"
	"fmt"
	"sync"

	"go.yaml.in/yaml/v3"
)

//go:embed openapi.yaml
var openAPI []byte

// OpenAPI returns the OpenAPI 3 document of the operator API
// (proto/openapi.yaml). The coordinator's contract tests prove that the
// routes it serves and the bodies it returns match it.
func OpenAPI() []byte { return append([]byte(nil), openAPI...) }

var openAPIJSON = sync.OnceValues(func() ([]byte, error) { return yamlToJSON(openAPI) })

// OpenAPIJSON returns the same document as OpenAPI, rendered as JSON
// (object keys sorted). It is converted once.
func OpenAPIJSON() ([]byte, error) {
	b, err := openAPIJSON()
	if err != nil {
		return nil, err
	}
	return append([]byte(nil), b...), nil
}

// yamlToJSON converts a YAML document whose mapping keys are scalars to
// JSON.
func yamlToJSON(src []byte) ([]byte, error) {
	var v any
	if err := yaml.Unmarshal(src, &v); err != nil {
		return nil, fmt.Errorf("parse OpenAPI YAML: %w", err)
	}
	v, err := jsonable(v, "")
	if err != nil {
		return nil, err
	}
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("render OpenAPI JSON: %w", err)
	}
	return b, nil
}

// jsonable turns the maps YAML decodes (string or scalar keys) into
// map[string]any, recursively.
func jsonable(v any, at string) (any, error) {
	switch t := v.(type) {
	case map[string]any:
		for k, e := range t {
			c, err := jsonable(e, at+"."+k)
			if err != nil {
				return nil, err
			}
			t[k] = c
		}
		return t, nil
	case map[any]any:
		out := make(map[string]any, len(t))
		for k, e := range t {
			var ks string
			switch k.(type) {
			case string, int, int64, uint64, float64, bool:
				ks = fmt.Sprint(k)
			default:
				return nil, fmt.Errorf("OpenAPI YAML at %s: key %v (%T) is not a scalar", at, k, k)
			}
			c, err := jsonable(e, at+"."+ks)
			if err != nil {
				return nil, err
			}
			out[ks] = c
		}
		return out, nil
	case []any:
		for i, e := range t {
			c, err := jsonable(e, fmt.Sprintf("%s[%d]", at, i))
			if err != nil {
				return nil, err
			}
			t[i] = c
		}
		return t, nil
	}
	return v, nil
}
