package proto

import (
	"regexp"
	"time"
)

// APITokenCreateType records an API bearer token an admin made
// (POST /v1/operator/tokens): its name (the principal, the owner of what
// it creates), role and SHA-256 only; the token itself is shown once.
// APITokenRevokeType revokes the live token of a name. Both are applied
// by the server's FSM wrapper beside the peers table (never by the ledger
// FSM) and proposed with IgnoreUnknownTypeFlag.
const (
	APITokenCreateType MessageType = 85
	APITokenRevokeType MessageType = 86
)

func init() {
	messageTypeNames[APITokenCreateType] = "api_token_create"
	messageTypeNames[APITokenRevokeType] = "api_token_revoke"
}

// APITokenRoles are the roles a replicated token may carry.
var APITokenRoles = []string{"admin", "operator", "viewer", "tenant"}

var apiTokenHashRe = regexp.MustCompile(`^[0-9a-f]{64}$`)

// APITokenCreateRequest is the body of APITokenCreateType.
type APITokenCreateRequest struct {
	At   time.Time `json:"at"`
	Name string    `json:"name"`
	Role string    `json:"role"`
	// Hash is the hex SHA-256 of the token.
	Hash string `json:"hash"`
	// By names the admin who made it.
	By string `json:"by,omitempty"`
}

// Validate checks the fields every replica relies on.
func (r *APITokenCreateRequest) Validate() error {
	if err := ValidateID("token name", r.Name); err != nil {
		return err
	}
	known := false
	for _, role := range APITokenRoles {
		known = known || role == r.Role
	}
	if !known {
		return Errorf(CodeInvalidArgument, "token role %q is not one of %v", truncate(r.Role, 40), APITokenRoles)
	}
	if !apiTokenHashRe.MatchString(r.Hash) {
		return Errorf(CodeInvalidArgument, "token hash must be 64 lowercase hex digits")
	}
	return nil
}

// APITokenRevokeRequest is the body of APITokenRevokeType.
type APITokenRevokeRequest struct {
	At   time.Time `json:"at"`
	Name string    `json:"name"`
	By   string    `json:"by,omitempty"`
}

// APIToken is one replicated token record; Hash is never shown by the
// API.
type APIToken struct {
	Name      string     `json:"name"`
	Role      string     `json:"role"`
	Hash      string     `json:"hash,omitempty"`
	By        string     `json:"by,omitempty"`
	CreatedAt time.Time  `json:"created_at"`
	RevokedAt *time.Time `json:"revoked_at,omitempty"`
	RevokedBy string     `json:"revoked_by,omitempty"`
}

// APITokenCreateBody is the body of POST /v1/operator/tokens.
type APITokenCreateBody struct {
	Name string `json:"name"`
	Role string `json:"role"`
}

// APITokenCreated answers POST /v1/operator/tokens: the token, shown
// once.
type APITokenCreated struct {
	Name      string    `json:"name"`
	Role      string    `json:"role"`
	Token     string    `json:"token"`
	CreatedAt time.Time `json:"created_at"`
}
