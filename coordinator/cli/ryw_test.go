package cli

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/coordinator/api"
	"github.com/gpuaas/gpuaas/coordinator/pki"
)

// TestReadYourWritesIndex: a write remembers its X-Gpuaas-Index in the
// cache directory, keyed by the token's hash; the next read sends it as
// ?min_index; an index the cluster never reached is forgotten and the
// read answered without it; without a cache directory nothing is kept.
func TestReadYourWritesIndex(t *testing.T) {
	c := startCoordinator(t)
	var mu sync.Mutex
	var queries []string
	target, err := url.Parse("https://" + c.addr)
	require.NoError(t, err)
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.Transport = &http.Transport{TLSClientConfig: pki.ClientConfig(c.ca.Pool(), nil)}
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		queries = append(queries, r.Method+" "+r.URL.Path+"?"+r.URL.RawQuery)
		mu.Unlock()
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(proxy.Close)
	last := func() string {
		mu.Lock()
		defer mu.Unlock()
		return queries[len(queries)-1]
	}
	cache := t.TempDir()
	tok := c.tok[api.RoleAdmin]
	env := map[string]string{"GPUAAS_ADDR": proxy.URL, "GPUAAS_TOKEN": tok, "XDG_CACHE_HOME": cache}
	file := filepath.Join(cache, "gpuaas", indexFileName)

	r := runEnv(env, "region", "set", "us-west")
	require.Equal(t, ExitOK, r.code, r.err)
	m := loadIndexes(file)
	require.Contains(t, m, indexKey(tok))
	idx := m[indexKey(tok)].Index
	require.Positive(t, idx)
	assert.LessOrEqual(t, idx, c.srv.Store().Snapshot().Index())
	b, err := os.ReadFile(file)
	require.NoError(t, err)
	assert.NotContains(t, string(b), tok, "the token itself is never stored")
	st, err := os.Stat(file)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), st.Mode().Perm())

	r = runEnv(env, "region", "list")
	require.Equal(t, ExitOK, r.code, r.err)
	assert.Contains(t, r.out, "us-west")
	assert.Contains(t, last(), "GET /v1/regions?")
	assert.Contains(t, last(), "min_index="+jsonNum(idx))
	// --consistent reads through the leader instead.
	runEnv(env, "--consistent", "region", "list")
	assert.NotContains(t, last(), "min_index")
	// Another token (another cluster): nothing sent.
	other := map[string]string{"GPUAAS_ADDR": proxy.URL, "GPUAAS_TOKEN": c.tok[api.RoleViewer], "XDG_CACHE_HOME": cache}
	runEnv(other, "region", "list")
	assert.NotContains(t, last(), "min_index")

	// An index this cluster never reached: forgotten, read again without.
	m[indexKey(tok)] = rememberedIndex{Index: 1 << 40}
	b, err = json.Marshal(m)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(file, b, 0o600))
	r = runEnv(env, "region", "list")
	require.Equal(t, ExitOK, r.code, r.err)
	assert.Contains(t, r.out, "us-west")
	assert.NotContains(t, last(), "min_index")
	assert.NotContains(t, loadIndexes(file), indexKey(tok))

	// No cache directory in the environment: nothing written, nothing sent.
	bare := map[string]string{"GPUAAS_ADDR": proxy.URL, "GPUAAS_TOKEN": tok}
	require.Equal(t, ExitOK, runEnv(bare, "region", "set", "us-north").code)
	runEnv(bare, "region", "list")
	assert.False(t, strings.Contains(last(), "min_index"))
}

func jsonNum(n uint64) string {
	b, _ := json.Marshal(n)
	return string(b)
}
