package client

import (
	"context"
	"fmt"
	"io"
	"net/http"

	"github.com/gpuaas/gpuaas/proto"
)

// Bundle fetches a published bundle's bytes with the node credential and
// verifies them against the digest.
func (c *Client) Bundle(ctx context.Context, ref string) ([]byte, error) {
	if err := proto.ValidateBundleRef("bundle", ref); err != nil || ref == "" {
		return nil, fmt.Errorf("fetch bundle: %q is not sha256:<64 hex digits>", ref)
	}
	c.mu.Lock()
	start, cred := c.next, c.credential
	c.mu.Unlock()
	var lastErr error
	for i := range c.urls {
		u := c.urls[(start+i)%len(c.urls)] + proto.BundleContentPath(ref)
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
		if err != nil {
			return nil, fmt.Errorf("fetch bundle %s: %w", ref, err)
		}
		req.Header.Set("Authorization", "Bearer "+cred)
		resp, err := c.http.Do(req)
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			lastErr = &TransportError{Err: err}
			continue
		}
		if resp.StatusCode != http.StatusOK {
			lastErr = fmt.Errorf("fetch bundle %s: %w", ref, decode(resp, nil))
			if resp.StatusCode == http.StatusServiceUnavailable {
				continue
			}
			return nil, lastErr
		}
		b, err := io.ReadAll(io.LimitReader(resp.Body, proto.MaxBundleBytes+1))
		resp.Body.Close()
		if err != nil {
			lastErr = &TransportError{Err: err}
			continue
		}
		if got := proto.BundleDigest(b); got != ref {
			return nil, fmt.Errorf("fetch bundle %s: digest mismatch: the content's digest is %s", ref, got)
		}
		return b, nil
	}
	return nil, fmt.Errorf("fetch bundle %s: %w", ref, lastErr)
}
