package ui

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"time"
)

// SessionKeySize is the size of the console's session key: AES-256.
const SessionKeySize = 32

const (
	sessionCookie = "gpuaas_session"
	loginCookie   = "gpuaas_login_csrf"
	cookiePath    = "/ui/"
	sessionAAD    = "gpuaas-ui-session-v1"
)

// session is what the sealed cookie holds.
type session struct {
	Token   string `json:"t"`
	CSRF    string `json:"c"`
	Expires int64  `json:"e"` // unix seconds
}

// sealer seals and opens session cookies.
type sealer struct{ aead cipher.AEAD }

func newSealer(key []byte) (*sealer, error) {
	if len(key) != SessionKeySize {
		return nil, fmt.Errorf("ui session key is %d bytes, want %d", len(key), SessionKeySize)
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, fmt.Errorf("ui session key: %w", err)
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, fmt.Errorf("ui session key: %w", err)
	}
	return &sealer{aead: aead}, nil
}

func (s *sealer) seal(v session) (string, error) {
	plain, err := json.Marshal(v)
	if err != nil {
		return "", fmt.Errorf("encode session: %w", err)
	}
	nonce := make([]byte, s.aead.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return "", fmt.Errorf("session nonce: %w", err)
	}
	return base64.RawURLEncoding.EncodeToString(s.aead.Seal(nonce, nonce, plain, []byte(sessionAAD))), nil
}

var errNoSession = errors.New("no valid session")

func (s *sealer) open(value string, now time.Time) (session, error) {
	var v session
	raw, err := base64.RawURLEncoding.DecodeString(value)
	if err != nil || len(raw) < s.aead.NonceSize() {
		return v, errNoSession
	}
	n := s.aead.NonceSize()
	plain, err := s.aead.Open(nil, raw[:n], raw[n:], []byte(sessionAAD))
	if err != nil {
		return v, errNoSession
	}
	if err := json.Unmarshal(plain, &v); err != nil || v.Token == "" || v.CSRF == "" {
		return session{}, errNoSession
	}
	if now.Unix() >= v.Expires {
		return session{}, errNoSession
	}
	return v, nil
}

// LoadSessionKey reads a session key file: 64 hex digits (surrounding
// white space allowed), mode 0600 or stricter.
func LoadSessionKey(path string) ([]byte, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("load ui session key: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("load ui session key %s: not a regular file", path)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("load ui session key %s: mode %04o lets group or others read it; chmod 600", path, fi.Mode().Perm())
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("load ui session key: %w", err)
	}
	raw, err := hex.DecodeString(strings.TrimSpace(string(b)))
	if err != nil || len(raw) != SessionKeySize {
		return nil, fmt.Errorf("load ui session key %s: want %d hex digits", path, 2*SessionKeySize)
	}
	return raw, nil
}

func randomToken() string {
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		panic(fmt.Sprintf("crypto/rand: %v", err))
	}
	return base64.RawURLEncoding.EncodeToString(b)
}

func sameSecret(a, b string) bool {
	return a != "" && subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1
}

func cookie(r *http.Request, name, value string, maxAge int) *http.Cookie {
	return &http.Cookie{Name: name, Value: value, Path: cookiePath, MaxAge: maxAge, HttpOnly: true,
		Secure: r.TLS != nil, SameSite: http.SameSiteStrictMode}
}
