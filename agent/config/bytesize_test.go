package config

import (
	"encoding/json"
	"io"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestByteSize(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]int64{"4096": 4096, "64MiB": 64 << 20, "100GiB": 100 << 30, "1TiB": 1 << 40, "3KiB": 3 << 10, " 2 GiB ": 2 << 30, "7B": 7} {
		var b ByteSize
		require.NoError(t, b.Set(in), in)
		assert.Equal(t, want, int64(b), in)
	}
	for _, in := range []string{"", "lots", "-1GiB", "1.5GiB", "99999999999TiB"} {
		var b ByteSize
		assert.Error(t, b.Set(in), in)
	}
	assert.Equal(t, "100GiB", ByteSize(100<<30).String())
	assert.Equal(t, "1025B", ByteSize(1025).String())
	var b ByteSize
	require.NoError(t, json.Unmarshal([]byte(`"8GiB"`), &b))
	assert.Equal(t, ByteSize(8<<30), b)
	require.NoError(t, json.Unmarshal([]byte(`1234`), &b))
	assert.Equal(t, ByteSize(1234), b)
	out, err := json.Marshal(ByteSize(8 << 30))
	require.NoError(t, err)
	assert.Equal(t, `"8GiB"`, string(out))
}

func TestImageCacheSettings(t *testing.T) {
	t.Parallel()
	root := hostRoot(t)
	env := map[string]string{"GPUAAS_AGENT_IMAGE_MIRROR": "http://mirror.lab:8080/blobs"}
	cfg, err := Load([]string{"-host-root", root, "-image-cache-budget", "50GiB"}, func(k string) string { return env[k] }, io.Discard)
	require.NoError(t, err)
	assert.Equal(t, ByteSize(50<<30), cfg.ImageCacheBudget)
	assert.Equal(t, "http://mirror.lab:8080/blobs", cfg.ImageMirror)
	def, err := Load([]string{"-host-root", root}, func(string) string { return "" }, io.Discard)
	require.NoError(t, err)
	assert.Equal(t, ByteSize(100<<30), def.ImageCacheBudget)
}
