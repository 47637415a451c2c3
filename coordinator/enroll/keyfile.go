package enroll

import (
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"os"
	"strings"

	"github.com/gpuaas/gpuaas/internal/atomicfile"
	"github.com/gpuaas/gpuaas/proto"
)

// NewGossipKey returns a fresh random gossip key (base64 of 32 bytes,
// AES-256), the form `gpuaasctl operator gossip-key install` and
// -gossip-key-file take.
func NewGossipKey() string {
	var b [proto.GossipKeySize]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("crypto/rand: " + err.Error())
	}
	return base64.StdEncoding.EncodeToString(b[:])
}

// LoadGossipKeyFile reads a gossip key file: one base64 key of 32 bytes,
// in a regular file only its owner can read (mode 0600).
func LoadGossipKeyFile(path string) (string, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return "", fmt.Errorf("load gossip key: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return "", fmt.Errorf("load gossip key %s: not a regular file", path)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return "", fmt.Errorf("load gossip key %s: mode %04o lets group or others read it; chmod 600", path, fi.Mode().Perm())
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("load gossip key: %w", err)
	}
	key := strings.TrimSpace(string(b))
	if _, err := proto.DecodeGossipKey(key); err != nil {
		return "", fmt.Errorf("load gossip key %s: %w", path, err)
	}
	return key, nil
}

// GenerateGossipKeyFile writes a fresh gossip key file (mode 0600) at
// path; it refuses to overwrite an existing file.
func GenerateGossipKeyFile(path string) error {
	if err := atomicfile.Create(path, []byte(NewGossipKey()+"\n"), 0o600); err != nil {
		return fmt.Errorf("generate gossip key: %w", err)
	}
	return nil
}
