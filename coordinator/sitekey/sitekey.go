// Package sitekey seals site secrets (MAAS API keys) with AES-256-GCM
// under a key file every coordinator replica holds (-site-key-file).
//
// A secret is sealed by the replica that receives it, BEFORE it is proposed
// to Raft: the log, the snapshots and the ledger only ever hold the sealed
// form (proto.SealedSecret). The site name is the additional authenticated
// data, so a sealed key moved to another site does not open. Opening is
// done only by the leader, right before it calls MAAS.
package sitekey

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/gpuaas/gpuaas/internal/atomicfile"
	"github.com/gpuaas/gpuaas/proto"
)

// KeySize is the size of a site key: AES-256.
const KeySize = 32

// Key is a loaded site key.
type Key struct {
	aead cipher.AEAD
	id   string
}

// ErrWrongKey is returned when a secret was sealed under another key.
var ErrWrongKey = errors.New("sealed with a different site key")

// New builds a key from KeySize raw bytes.
func New(raw []byte) (*Key, error) {
	if len(raw) != KeySize {
		return nil, fmt.Errorf("site key is %d bytes, want %d", len(raw), KeySize)
	}
	block, err := aes.NewCipher(raw)
	if err != nil {
		return nil, fmt.Errorf("site key: %w", err)
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, fmt.Errorf("site key: %w", err)
	}
	sum := sha256.Sum256(append([]byte("gpuaas-site-key-id\x00"), raw...))
	return &Key{aead: aead, id: hex.EncodeToString(sum[:8])}, nil
}

// Load reads a key file: 64 hex digits (surrounding white space allowed).
// A file readable by group or others is refused.
func Load(path string) (*Key, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("load site key: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("load site key %s: not a regular file", path)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("load site key %s: mode %04o lets group or others read it; chmod 600", path, fi.Mode().Perm())
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("load site key: %w", err)
	}
	raw, err := hex.DecodeString(strings.TrimSpace(string(b)))
	if err != nil || len(raw) != KeySize {
		return nil, fmt.Errorf("load site key %s: want %d hex digits", path, 2*KeySize)
	}
	return New(raw)
}

// Generate writes a fresh random key file (mode 0600) at path; it refuses
// to overwrite an existing file. A crash leaves no partial key behind.
func Generate(path string) error {
	raw := make([]byte, KeySize)
	if _, err := rand.Read(raw); err != nil {
		return fmt.Errorf("generate site key: %w", err)
	}
	if err := atomicfile.Create(path, []byte(hex.EncodeToString(raw)+"\n"), 0o600); err != nil {
		return fmt.Errorf("generate site key: %w", err)
	}
	return nil
}

// ID names the key (a digest prefix; it reveals nothing of the key).
func (k *Key) ID() string { return k.id }

func aad(site string) []byte { return []byte("gpuaas-site-secret\x00" + site) }

// Seal encrypts secret for site.
func (k *Key) Seal(site string, secret []byte) (*proto.SealedSecret, error) {
	nonce := make([]byte, k.aead.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return nil, fmt.Errorf("seal secret of site %s: %w", site, err)
	}
	return &proto.SealedSecret{KeyID: k.id, Nonce: nonce, Ciphertext: k.aead.Seal(nil, nonce, secret, aad(site))}, nil
}

// Open decrypts a secret sealed for site.
func (k *Key) Open(site string, s *proto.SealedSecret) ([]byte, error) {
	if s == nil {
		return nil, fmt.Errorf("open secret of site %s: none is stored", site)
	}
	if s.KeyID != k.id {
		return nil, fmt.Errorf("open secret of site %s: key %s: %w (this replica has key %s)", site, s.KeyID, ErrWrongKey, k.id)
	}
	if len(s.Nonce) != k.aead.NonceSize() {
		return nil, fmt.Errorf("open secret of site %s: nonce is %d bytes", site, len(s.Nonce))
	}
	out, err := k.aead.Open(nil, s.Nonce, s.Ciphertext, aad(site))
	if err != nil {
		return nil, fmt.Errorf("open secret of site %s: authentication failed (tampered, or sealed for another site)", site)
	}
	return out, nil
}
