package ui

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"

	"github.com/gpuaas/gpuaas/coordinator/cli"
	"github.com/gpuaas/gpuaas/proto"
)

// inProcess is an http.RoundTripper that serves each request with the
// API's handler in this process: the request goes through the API's whole
// chain (authentication, authorize, limits, logging, forwarding to the
// leader) exactly as one from gpuaasctl would.
type inProcess struct{ h http.Handler }

type remoteKey struct{}

func (t inProcess) RoundTrip(req *http.Request) (*http.Response, error) {
	if addr, ok := req.Context().Value(remoteKey{}).(string); ok {
		req.RemoteAddr = addr
	}
	req.RequestURI = req.URL.RequestURI()
	w := &responseBuffer{header: http.Header{}}
	t.h.ServeHTTP(w, req)
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return &http.Response{
		Status: fmt.Sprintf("%d %s", w.status, http.StatusText(w.status)), StatusCode: w.status,
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: w.header, Body: io.NopCloser(bytes.NewReader(w.body.Bytes())),
		ContentLength: int64(w.body.Len()), Request: req,
	}, nil
}

// responseBuffer collects one in-process answer.
type responseBuffer struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (w *responseBuffer) Header() http.Header { return w.header }
func (w *responseBuffer) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
}
func (w *responseBuffer) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.body.Write(b)
}
func (w *responseBuffer) Flush() {}

// apiClient is one user's view of the API for one page: their token,
// their remote address.
type apiClient struct {
	c   *cli.Client
	ctx context.Context
}

func (u *UI) client(r *http.Request, token string) *apiClient {
	base := &url.URL{Scheme: "http", Host: "in-process"}
	return &apiClient{
		c:   &cli.Client{Base: base, Token: token, HTTP: u.hc},
		ctx: context.WithValue(r.Context(), remoteKey{}, r.RemoteAddr),
	}
}

// get reads path into v and returns the answer's index.
func (a *apiClient) get(path string, q url.Values, v any) (uint64, error) {
	res, err := a.c.Do(a.ctx, http.MethodGet, path, q, nil, nil)
	if err != nil {
		return 0, err
	}
	if err := json.Unmarshal(res.Body, v); err != nil {
		return 0, fmt.Errorf("decode GET %s: %w", path, err)
	}
	return indexOf(res), nil
}

// send writes; v may be nil. It returns the write's index.
func (a *apiClient) send(method, path string, body any, hdr http.Header, v any) (uint64, error) {
	res, err := a.c.Do(a.ctx, method, path, nil, body, hdr)
	if err != nil {
		return 0, err
	}
	if v != nil {
		if err := json.Unmarshal(res.Body, v); err != nil {
			return 0, fmt.Errorf("decode %s %s: %w", method, path, err)
		}
	}
	return indexOf(res), nil
}

func indexOf(res *cli.Response) uint64 {
	n, _ := strconv.ParseUint(res.Header.Get(proto.IndexHeader), 10, 64)
	return n
}

// after returns the blocking-query parameters that make a read wait
// until this replica has applied index (read-your-writes), or nil.
func after(index uint64) url.Values {
	if index == 0 {
		return nil
	}
	return url.Values{"index": {strconv.FormatUint(index-1, 10)}, "wait": {"5s"}}
}
