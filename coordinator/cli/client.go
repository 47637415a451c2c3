package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"

	"github.com/gpuaas/gpuaas/proto"
)

// Client calls the operator API.
type Client struct {
	Base  *url.URL // e.g. http://127.0.0.1:7300
	Token string
	HTTP  *http.Client
}

// ProblemError is an API error answer (application/problem+json).
type ProblemError struct {
	proto.Problem
}

func (e *ProblemError) Error() string {
	s := fmt.Sprintf("%s (%s, HTTP %d): %s", e.Title, e.Code, e.Status, e.Detail)
	if e.RequestID != "" {
		s += " [request " + e.RequestID + "]"
	}
	return s
}

// ParseAddr accepts "host:port" or an http(s) URL.
func ParseAddr(addr string) (*url.URL, error) {
	if addr == "" {
		return nil, fmt.Errorf("no API address: set --addr or GPUAAS_ADDR")
	}
	if !strings.Contains(addr, "://") {
		addr = "http://" + addr
	}
	u, err := url.Parse(addr)
	if err != nil {
		return nil, fmt.Errorf("API address %q: %w", addr, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" || u.Host == "" {
		return nil, fmt.Errorf("API address %q must be host:port or an http(s) URL", addr)
	}
	return u, nil
}

// pathEscape escapes one path segment (an ID typed by the operator).
func pathEscape(s string) string { return url.PathEscape(s) }

// Response is a successful answer.
type Response struct {
	Status int
	Header http.Header
	Body   []byte
}

// RawBody is a request body sent as is (not JSON-encoded), e.g. a bundle.
type RawBody struct {
	ContentType string
	Data        []byte
}

// Do sends one request. body is nil, a RawBody sent as is, or a value sent as JSON. A non-2xx
// answer is returned as *ProblemError when it is a problem body, else as
// a plain error naming the status.
func (c *Client) Do(ctx context.Context, method, path string, q url.Values, body any, hdr http.Header) (*Response, error) {
	res, err := c.send(ctx, method, path, q, body, hdr)
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(io.LimitReader(res.Body, 64<<20))
	if err != nil {
		return nil, fmt.Errorf("%s %s: read answer: %w", method, path, err)
	}
	if res.StatusCode >= 300 {
		return nil, answerError(method, path, res, b)
	}
	return &Response{Status: res.StatusCode, Header: res.Header, Body: b}, nil
}

// Stream sends a GET and copies a 2xx answer's body to w as it arrives
// (an export of any size); errors are Do's.
func (c *Client) Stream(ctx context.Context, path string, q url.Values, w io.Writer) error {
	res, err := c.send(ctx, http.MethodGet, path, q, nil, nil)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	if res.StatusCode >= 300 {
		b, _ := io.ReadAll(io.LimitReader(res.Body, 1<<20))
		return answerError(http.MethodGet, path, res, b)
	}
	if _, err := io.Copy(w, res.Body); err != nil {
		return fmt.Errorf("GET %s: read answer: %w", path, err)
	}
	return nil
}

// answerError turns a non-2xx answer into *ProblemError or a plain error.
func answerError(method, path string, res *http.Response, b []byte) error {
	var p proto.Problem
	if strings.HasPrefix(res.Header.Get("Content-Type"), proto.ProblemContentType) && json.Unmarshal(b, &p) == nil && p.Code != "" {
		return &ProblemError{Problem: p}
	}
	return fmt.Errorf("%s %s: HTTP %d: %s", method, path, res.StatusCode, strings.TrimSpace(string(truncate(b, 300))))
}

// send builds and sends one request; the caller closes the body.
func (c *Client) send(ctx context.Context, method, path string, q url.Values, body any, hdr http.Header) (*http.Response, error) {
	// path is already escaped (IDs go through pathEscape).
	u := *c.Base
	raw := strings.TrimSuffix(c.Base.EscapedPath(), "/") + path
	unescaped, err := url.PathUnescape(raw)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	u.Path, u.RawPath = unescaped, raw
	if len(q) > 0 {
		u.RawQuery = q.Encode()
	}
	var rd io.Reader
	ctype := "application/json"
	if raw, ok := body.(RawBody); ok {
		rd, ctype = bytes.NewReader(raw.Data), raw.ContentType
	} else if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, fmt.Errorf("encode %s %s body: %w", method, path, err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, u.String(), rd)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	for k, vs := range hdr {
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	if body != nil {
		req.Header.Set("Content-Type", ctype)
	}
	req.Header.Set("Accept", "application/json")
	req.Header.Set("Authorization", "Bearer "+c.Token)
	hc := c.HTTP
	if hc == nil {
		hc = http.DefaultClient
	}
	res, err := hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", method, u.Redacted(), err)
	}
	return res, nil
}

func truncate(b []byte, n int) []byte {
	if len(b) > n {
		return append(b[:n:n], "..."...)
	}
	return b
}

// decode unmarshals a response body.
func decode[T any](r *Response) (T, error) {
	var v T
	if err := json.Unmarshal(r.Body, &v); err != nil {
		return v, fmt.Errorf("decode answer: %w", err)
	}
	return v, nil
}

// IsProblem reports whether err is an API problem with code.
func IsProblem(err error, code proto.Code) bool {
	var pe *ProblemError
	return errors.As(err, &pe) && pe.Code == code
}
