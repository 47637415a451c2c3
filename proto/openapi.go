package proto

import _ "embed"

//go:embed openapi.yaml
var openAPI []byte

// OpenAPI returns the OpenAPI 3 document of the operator API
// (proto/openapi.yaml). The coordinator's contract tests prove that the
// routes it serves and the bodies it returns match it.
func OpenAPI() []byte { return append([]byte(nil), openAPI...) }
