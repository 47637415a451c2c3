package blobs

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func sample(t *testing.T, n int) ([]byte, string) {
	t.Helper()
	b := make([]byte, n)
	_, err := rand.Read(b)
	require.NoError(t, err)
	s := sha256.Sum256(b)
	return b, "sha256:" + hex.EncodeToString(s[:])
}

func TestPutVerifies(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "tmp"), 0o750))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "tmp", "leftover"), []byte("x"), 0o600))
	s, err := Open(dir)
	require.NoError(t, err)
	_, err = os.Stat(filepath.Join(dir, "tmp", "leftover"))
	assert.True(t, os.IsNotExist(err), "interrupted uploads are cleaned at open")

	data, digest := sample(t, 1<<20+3)
	size := int64(len(data))
	for name, tc := range map[string]struct {
		body []byte
		want string
	}{
		"short":    {data[:10], "10 bytes"},
		"long":     {append(bytes.Clone(data), 'x'), "longer"},
		"flipped":  {append([]byte{data[0] ^ 1}, data[1:]...), "sha256 is"},
		"no bytes": {nil, "0 bytes"},
	} {
		_, err := s.Put(bytes.NewReader(tc.body), digest, size)
		var m *MismatchError
		require.ErrorAs(t, err, &m, name)
		assert.Contains(t, err.Error(), tc.want, name)
		assert.False(t, s.Has(digest, size), name)
	}
	tmps, _ := os.ReadDir(filepath.Join(dir, "tmp"))
	assert.Empty(t, tmps)
	_, err = s.Put(bytes.NewReader(data), "sha256:XYZ", size)
	require.Error(t, err)

	n, err := s.Put(bytes.NewReader(data), digest, size)
	require.NoError(t, err)
	assert.Equal(t, size, n)
	require.True(t, s.Has(digest, size))
	assert.False(t, s.Has(digest, size+1))
	f, err := s.Open(digest)
	require.NoError(t, err)
	got, _ := io.ReadAll(f)
	f.Close()
	assert.True(t, bytes.Equal(data, got))
	// Storing it again is harmless.
	_, err = s.Put(bytes.NewReader(data), digest, size)
	require.NoError(t, err)
}

func TestFetchOnceAndVerified(t *testing.T) {
	t.Parallel()
	s, err := Open(t.TempDir())
	require.NoError(t, err)
	data, digest := sample(t, 256<<10)
	size := int64(len(data))
	var calls atomic.Int64
	get := func(context.Context) (io.ReadCloser, error) {
		calls.Add(1)
		time.Sleep(30 * time.Millisecond)
		return io.NopCloser(bytes.NewReader(data)), nil
	}
	var wg sync.WaitGroup
	for range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			assert.NoError(t, s.Fetch(context.Background(), digest, size, get))
		}()
	}
	wg.Wait()
	assert.Equal(t, int64(1), calls.Load())
	assert.True(t, s.Has(digest, size))

	// A peer sending other bytes is refused; an unreachable one is an error.
	bad, digest2 := sample(t, 1000)
	bad[0] ^= 1
	err = s.Fetch(context.Background(), digest2, 1000, func(context.Context) (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(bad)), nil
	})
	assert.True(t, IsMismatch(err))
	assert.False(t, s.Has(digest2, 1000))
	boom := errors.New("peer down")
	err = s.Fetch(context.Background(), digest2, 1000, func(context.Context) (io.ReadCloser, error) { return nil, boom })
	assert.ErrorIs(t, err, boom)
}
