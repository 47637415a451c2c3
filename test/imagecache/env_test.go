package imagecache

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/agent/client"
	"github.com/gpuaas/gpuaas/coordinator/api"
	"github.com/gpuaas/gpuaas/coordinator/cli"
	"github.com/gpuaas/gpuaas/coordinator/server"
	"github.com/gpuaas/gpuaas/proto"
)

// coord is a real single-node coordinator (Raft, bbolt, blob store) with
// the operator and agent APIs on one loopback listener.
type coord struct {
	url   string
	srv   *server.Server
	admin *cli.Client
	oper  *cli.Client
}

func startCoordinator(t testing.TB) *coord {
	t.Helper()
	tok := map[string]string{}
	var entries []api.TokenEntry
	for _, r := range []string{"admin", "operator"} {
		s, err := api.GenerateToken()
		require.NoError(t, err)
		tok[r] = s
		entries = append(entries, api.TokenEntry{Name: r + "-user", Role: r, SHA256: api.HashToken(s)})
	}
	auth, err := api.NewTokens(entries)
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	srv, err := server.New(server.Config{NodeID: "c1", DataDir: t.TempDir(), RaftBind: "127.0.0.1:0",
		HTTPAddr: ln.Addr().String(), BootstrapExpect: 1, Logger: log})
	if err != nil {
		ln.Close()
		require.NoError(t, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/v1/internal/", srv.InternalHandler())
	mux.Handle("/", api.New(srv, auth, log))
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go hs.Serve(ln)
	t.Cleanup(func() {
		hs.Close()
		done := make(chan struct{})
		go func() { srv.Shutdown(); close(done) }()
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			t.Errorf("coordinator did not shut down within 15s")
		}
	})
	require.Eventually(t, srv.IsLeader, 15*time.Second, 10*time.Millisecond, "single-node coordinator never led")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	require.NoError(t, srv.LoadInventory(ctx, server.SyntheticInventory("us-east", 2, 8)))
	base, err := url.Parse("http://" + ln.Addr().String())
	require.NoError(t, err)
	return &coord{url: base.String(), srv: srv,
		admin: &cli.Client{Base: base, Token: tok["admin"]}, oper: &cli.Client{Base: base, Token: tok["operator"]}}
}

func randomBlob(t testing.TB, n int) ([]byte, string) {
	t.Helper()
	b := make([]byte, n)
	_, err := rand.Read(b)
	require.NoError(t, err)
	s := sha256.Sum256(b)
	return b, "sha256:" + hex.EncodeToString(s[:])
}

// publish creates, uploads and approves an image.
func (c *coord) publish(t testing.TB, name, version string, data []byte, digest string) {
	t.Helper()
	ctx := context.Background()
	path := "/v1/images/" + name + "/" + version
	_, err := c.admin.Do(ctx, http.MethodPut, path, nil, proto.ImageBody{Kind: proto.ImageSliceBase, Digest: digest, Size: int64(len(data))}, nil)
	require.NoError(t, err)
	_, err = c.admin.Upload(ctx, path+"/blob", bytesReader(data), int64(len(data)))
	require.NoError(t, err)
	_, err = c.admin.Do(ctx, http.MethodPost, path+"/approve", nil, proto.ImageApproveBody{Note: "test"}, nil)
	require.NoError(t, err)
}

// enroll mints a bootstrap token for node and enrolls an agent client.
func (c *coord) enroll(t testing.TB, node string) *client.Client {
	t.Helper()
	r, err := c.admin.Do(context.Background(), http.MethodPost, "/v1/nodes/"+node+"/bootstrap-tokens", nil, nil, nil)
	require.NoError(t, err)
	var tok proto.BootstrapTokenResponse
	require.NoError(t, json.Unmarshal(r.Body, &tok))
	ac, err := client.New([]string{c.url}, "")
	require.NoError(t, err)
	_, err = ac.Enroll(context.Background(), node, tok.Token, node)
	require.NoError(t, err)
	return ac
}

// cutProxy forwards TCP connections to a target, counting the bytes each
// connection sends back; cutAfter > 0 closes the next connection after
// that many bytes back (once).
type cutProxy struct {
	ln       net.Listener
	target   string
	cutAfter atomic.Int64
	mu       sync.Mutex
	down     []int64 // bytes back, per connection
}

func newCutProxy(t testing.TB, target string) *cutProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &cutProxy{ln: ln, target: target}
	t.Cleanup(func() { ln.Close() })
	go p.serve()
	return p
}

func (p *cutProxy) url() string { return "http://" + p.ln.Addr().String() }

func (p *cutProxy) serve() {
	for {
		in, err := p.ln.Accept()
		if err != nil {
			return
		}
		out, err := net.Dial("tcp", p.target)
		if err != nil {
			in.Close()
			continue
		}
		p.mu.Lock()
		idx := len(p.down)
		p.down = append(p.down, 0)
		p.mu.Unlock()
		limit := p.cutAfter.Swap(0)
		go func() { _, _ = io.Copy(out, in); out.Close() }()
		go func() {
			defer in.Close()
			defer out.Close()
			buf := make([]byte, 256<<10)
			var n int64
			for {
				k, err := out.Read(buf)
				if k > 0 {
					if limit > 0 && n+int64(k) > limit {
						k = int(limit - n)
					}
					w, _ := in.Write(buf[:k])
					n += int64(w)
					p.mu.Lock()
					p.down[idx] = n
					p.mu.Unlock()
					if limit > 0 && n >= limit {
						return // cut
					}
				}
				if err != nil {
					return
				}
			}
		}()
	}
}

func (p *cutProxy) conns() []int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]int64(nil), p.down...)
}
