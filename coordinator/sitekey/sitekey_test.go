package sitekey_test

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/coordinator/sitekey"
)

func TestSealOpen(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "site.key")
	require.NoError(t, sitekey.Generate(path))
	require.ErrorContains(t, sitekey.Generate(path), "exists", "never overwrites a key")
	k, err := sitekey.Load(path)
	require.NoError(t, err)
	secret := []byte("consumer:token:very-secret")
	s, err := k.Seal("site-a", secret)
	require.NoError(t, err)
	require.NoError(t, s.Validate("sealed"))
	assert.False(t, bytes.Contains(s.Ciphertext, secret))
	assert.Equal(t, k.ID(), s.KeyID)
	got, err := k.Open("site-a", s)
	require.NoError(t, err)
	assert.Equal(t, secret, got)

	s2, err := k.Seal("site-a", secret)
	require.NoError(t, err)
	assert.NotEqual(t, s.Nonce, s2.Nonce, "fresh nonce per seal")

	_, err = k.Open("site-b", s)
	require.ErrorContains(t, err, "authentication failed", "bound to its site")
	bad := *s
	bad.Ciphertext = append([]byte(nil), s.Ciphertext...)
	bad.Ciphertext[0] ^= 1
	_, err = k.Open("site-a", &bad)
	require.ErrorContains(t, err, "authentication failed")
	_, err = k.Open("site-a", nil)
	require.ErrorContains(t, err, "none is stored")

	other, err := sitekey.New(bytes.Repeat([]byte{7}, 32))
	require.NoError(t, err)
	_, err = other.Open("site-a", s)
	require.ErrorIs(t, err, sitekey.ErrWrongKey)
}

func TestLoadRefusesBadFiles(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name, content string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, []byte(content), mode))
		require.NoError(t, os.Chmod(p, mode))
		return p
	}
	hex64 := "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"
	_, err := sitekey.Load(write("ok", hex64+"\n", 0o600))
	require.NoError(t, err)
	_, err = sitekey.Load(write("open", hex64, 0o644))
	require.ErrorContains(t, err, "lets group or others read it")
	_, err = sitekey.Load(write("short", "abcd", 0o600))
	require.ErrorContains(t, err, "want 64 hex digits")
	_, err = sitekey.Load(write("nothex", "zz"+hex64[2:], 0o600))
	require.ErrorContains(t, err, "want 64 hex digits")
	_, err = sitekey.Load(filepath.Join(dir, "missing"))
	require.Error(t, err)
	_, err = sitekey.Load(dir)
	require.ErrorContains(t, err, "not a regular file")
	_, err = sitekey.New(make([]byte, 16))
	require.ErrorContains(t, err, "want 32")
}
