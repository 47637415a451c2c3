package api

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"strings"

	"github.com/gpuaas/gpuaas/proto"
)

// Role is what a token may do. Roles are ordered: admin > operator >
// viewer > tenant. A tenant is the odd one out: it reads less than a
// viewer (the catalog and its own allocations only) but may create and
// release its own allocations; the tenant access table (tenant.go) says
// which routes it may use, and how.
type Role int

const (
	// RoleTenant creates, reads and releases only the allocations it owns
	// (owner = the token's name) and reads the catalog: images, regions,
	// pools and availability.
	RoleTenant Role = iota + 1
	// RoleViewer reads everything.
	RoleViewer
	// RoleOperator also creates and releases allocations.
	RoleOperator
	// RoleAdmin also manages nodes, slots, regions, pools, Raft peers and
	// force-releases allocations.
	RoleAdmin
)

var roleNames = map[Role]string{RoleTenant: "tenant", RoleViewer: "viewer", RoleOperator: "operator", RoleAdmin: "admin"}

func (r Role) String() string {
	if n, ok := roleNames[r]; ok {
		return n
	}
	return fmt.Sprintf("role(%d)", int(r))
}

// ParseRole parses "admin", "operator", "viewer" or "tenant".
func ParseRole(s string) (Role, error) {
	for r, n := range roleNames {
		if n == s {
			return r, nil
		}
	}
	return 0, fmt.Errorf("role %q is not one of admin, operator, viewer, tenant", s)
}

// Principal is the authenticated caller.
type Principal struct {
	Name string
	Role Role
}

// Authenticator resolves a bearer token to a principal.
type Authenticator interface {
	Authenticate(token string) (Principal, bool)
}

// TokenEntry is one line of a tokens file: the token itself is never
// stored, only its SHA-256 in hex.
type TokenEntry struct {
	Name   string `json:"name"`
	Role   string `json:"role"`
	SHA256 string `json:"sha256"`
}

type tokenHash struct {
	sum  [sha256.Size]byte
	name string
	role Role
}

// Tokens is an Authenticator over a fixed set of token hashes.
type Tokens struct {
	entries []tokenHash
}

// HashToken returns the hex SHA-256 of token, the form a tokens file holds.
func HashToken(token string) string {
	s := sha256.Sum256([]byte(token))
	return hex.EncodeToString(s[:])
}

// GenerateToken returns a new random token (32 bytes, hex, prefixed
// "gpuaas_" so it is recognisable in logs and secret scanners).
func GenerateToken() (string, error) {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("generate token: %w", err)
	}
	return "gpuaas_" + hex.EncodeToString(b[:]), nil
}

// NewTokens validates entries: names are identifiers and unique, roles
// known, hashes 64 hex digits and unique.
func NewTokens(entries []TokenEntry) (*Tokens, error) {
	t := &Tokens{}
	names := map[string]bool{}
	sums := map[[sha256.Size]byte]bool{}
	for i, e := range entries {
		if err := proto.ValidateID("token name", e.Name); err != nil {
			return nil, fmt.Errorf("token %d: %w", i, err)
		}
		if names[e.Name] {
			return nil, fmt.Errorf("token %d: name %q appears twice", i, e.Name)
		}
		names[e.Name] = true
		role, err := ParseRole(e.Role)
		if err != nil {
			return nil, fmt.Errorf("token %s: %w", e.Name, err)
		}
		raw, err := hex.DecodeString(strings.ToLower(e.SHA256))
		if err != nil || len(raw) != sha256.Size {
			return nil, fmt.Errorf("token %s: sha256 must be 64 hex digits", e.Name)
		}
		h := tokenHash{name: e.Name, role: role}
		copy(h.sum[:], raw)
		if sums[h.sum] {
			return nil, fmt.Errorf("token %s: the same token hash appears twice", e.Name)
		}
		sums[h.sum] = true
		t.entries = append(t.entries, h)
	}
	return t, nil
}

// LoadTokens reads a tokens file: a JSON array of TokenEntry.
func LoadTokens(path string) (*Tokens, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read tokens file: %w", err)
	}
	var entries []TokenEntry
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&entries); err != nil {
		return nil, fmt.Errorf("parse tokens file %s: %w", path, err)
	}
	t, err := NewTokens(entries)
	if err != nil {
		return nil, fmt.Errorf("tokens file %s: %w", path, err)
	}
	return t, nil
}

// Authenticate compares the token's hash with every entry in constant
// time (no early exit, so timing says nothing about which entry matched).
func (t *Tokens) Authenticate(token string) (Principal, bool) {
	if token == "" {
		return Principal{}, false
	}
	sum := sha256.Sum256([]byte(token))
	var found Principal
	ok := 0
	for _, e := range t.entries {
		if subtle.ConstantTimeCompare(sum[:], e.sum[:]) == 1 {
			found = Principal{Name: e.name, Role: e.role}
			ok = 1
		}
	}
	return found, ok == 1
}
