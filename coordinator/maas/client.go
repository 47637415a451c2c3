// Package maas is the coordinator's MAAS 2.0 client: the calls the MAAS
// workflows make (resolve, create, commission, tag, boot disk, storage
// layout, link_subnet, deploy, release, power, events), on top of
// github.com/canonical/gomaasclient, with two rules the workflows rely on:
//
//   - Every request has a deadline. gomaasclient takes no context, so each
//     call builds a gomaasclient whose transport derives every request's
//     context from the caller's ctx plus Config.RequestTimeout.
//   - A mutation is never retried blindly. A mutation that timed out, lost
//     its connection, or was answered 504 has an unknown outcome
//     (ErrUnknownOutcome): MAAS may have applied it. Long transitions
//     (commission, deploy, release) then poll the machine for the target
//     state and fail only on a MAAS failure state or expiry (DESIGN.md
//     invariant 6); short configuration writes (boot disk, storage layout,
//     link_subnet, tags) re-read and verify what they wrote. A mutation
//     whose connection was refused (the dial failed: a region restarting)
//     never reached MAAS: it fails with the plain error, and the caller
//     may send it again.
//
// gomaasapi underneath re-sends a request answered 409 or 503 with a
// Retry-After header by itself: MAAS sends those only when nothing was
// applied, so that retry is safe. It sleeps without a context, so only
// short waits (MaxInlineRetryAfter, what MAAS itself sends: 5 s and 10 s)
// are left to it; a longer Retry-After (a proxy or a region coming back
// in minutes) is returned at once as a *ServerError whose RetryAfter the
// caller honours (the MAAS workflow runner waits it out, cancellably).
package maas

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/canonical/gomaasclient/client"
	gomaasapi "github.com/juju/gomaasapi/v2"

	"github.com/gpuaas/gpuaas/proto"
)

// Config configures a Client.
type Config struct {
	// URL is the MAAS base URL ("http://maas:5240/MAAS/").
	URL string
	// APIKey is the "consumer:token:secret" API key (never logged).
	APIKey string
	// RequestTimeout bounds every HTTP request (default 30s).
	RequestTimeout time.Duration
	// PollInterval is how often a transition re-reads the machine
	// (default 5s).
	PollInterval time.Duration
	// Transport is the base transport (default http.DefaultTransport).
	Transport http.RoundTripper
	// Logger receives one line per mutation; default discards.
	Logger *slog.Logger
}

// Client talks to one MAAS region.
type Client struct {
	cfg Config
	log *slog.Logger
}

// ErrUnknownOutcome marks a mutation whose request may or may not have
// been applied by MAAS (client deadline, lost connection, 504).
var ErrUnknownOutcome = errors.New("outcome unknown: MAAS may have applied the request")

// ErrNotFound is returned when MAAS has no such object.
var ErrNotFound = errors.New("not found in MAAS")

// New checks cfg and returns a client. It does not contact MAAS.
func New(cfg Config) (*Client, error) {
	u, err := url.Parse(cfg.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("maas client: url %q is not an http(s) URL", cfg.URL)
	}
	if err := proto.ValidateMAASAPIKey(cfg.APIKey); err != nil {
		return nil, fmt.Errorf("maas client for %s: %w", cfg.URL, err)
	}
	if cfg.RequestTimeout <= 0 {
		cfg.RequestTimeout = 30 * time.Second
	}
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = 5 * time.Second
	}
	if cfg.Transport == nil {
		cfg.Transport = http.DefaultTransport
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Client{cfg: cfg, log: log.With("maas", u.Host)}, nil
}

// api returns a gomaasclient whose every request carries ctx and the
// request timeout. Building one is cheap (no I/O).
func (c *Client) api(ctx context.Context) (*client.Client, error) {
	mc, err := client.GetClientWithTransport(c.cfg.URL, c.cfg.APIKey, "2.0", deadlineTransport{ctx: ctx, timeout: c.cfg.RequestTimeout, base: c.cfg.Transport})
	if err != nil {
		// gomaasapi's errors may quote the key: never pass them on.
		return nil, fmt.Errorf("maas client for %s: cannot build the API client", c.cfg.URL)
	}
	return mc, nil
}

// deadlineTransport gives every request the caller's context bounded by
// timeout; the context ends when the response body is closed.
type deadlineTransport struct {
	ctx     context.Context
	timeout time.Duration
	base    http.RoundTripper
}

func (t deadlineTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	ctx, cancel := context.WithTimeout(t.ctx, t.timeout)
	resp, err := t.base.RoundTrip(r.WithContext(ctx))
	if err != nil {
		cancel()
		return nil, err
	}
	if ra := resp.Header.Get("Retry-After"); ra != "" && (resp.StatusCode == http.StatusServiceUnavailable || resp.StatusCode == http.StatusConflict) {
		if d, ok := parseRetryAfter(ra, time.Now()); !ok || d > MaxInlineRetryAfter {
			// Too long (or a date) for gomaasapi's context-free sleep:
			// hide it from gomaasapi, keep it for classify.
			resp.Header.Del("Retry-After")
			resp.Header.Set(deferredRetryAfter, ra)
		}
	}
	resp.Body = cancelBody{ReadCloser: resp.Body, cancel: cancel}
	return resp, nil
}

type cancelBody struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (b cancelBody) Close() error { err := b.ReadCloser.Close(); b.cancel(); return err }

// MaxInlineRetryAfter is the longest Retry-After gomaasapi waits out
// itself (up to 4 times per request); a longer one ends the call.
const MaxInlineRetryAfter = 10 * time.Second

// deferredRetryAfter carries a Retry-After hidden from gomaasapi.
const deferredRetryAfter = "X-Gpuaas-Deferred-Retry-After"

// ServerError is MAAS's answer to a refused request.
type ServerError struct {
	Status int
	Body   string
	// RetryAfter is MAAS's Retry-After (503, 409: the request was not
	// applied; try again after it), zero without one.
	RetryAfter time.Duration
}

// parseRetryAfter reads a Retry-After value: delay-seconds or an HTTP
// date (relative to now; a past date is 0).
func parseRetryAfter(v string, now time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if n, err := strconv.Atoi(v); err == nil {
		if n < 0 {
			return 0, false
		}
		return time.Duration(n) * time.Second, true
	}
	t, err := http.ParseTime(v)
	if err != nil {
		return 0, false
	}
	return max(t.Sub(now), 0), true
}

func (e *ServerError) Error() string {
	if e.RetryAfter > 0 {
		return fmt.Sprintf("MAAS answered %d (Retry-After %s): %s", e.Status, e.RetryAfter, e.Body)
	}
	return fmt.Sprintf("MAAS answered %d: %s", e.Status, e.Body)
}

// classify turns a gomaasclient error into this package's errors:
// *ServerError for MAAS answers (504 also wraps ErrUnknownOutcome, 404
// ErrNotFound), ErrUnknownOutcome for transport failures of mutations.
// MAAS's answer is quoted without the API key's parts (a MAAS, or a proxy
// in front of it, may echo the request's OAuth header).
func (c *Client) classify(err error, mutation bool) error {
	if err == nil {
		return nil
	}
	if se, ok := gomaasapi.GetServerError(err); ok {
		e := &ServerError{Status: se.StatusCode, Body: truncate(c.redact(se.BodyMessage), 300)}
		if se.StatusCode == http.StatusServiceUnavailable || se.StatusCode == http.StatusConflict {
			ra := se.Header.Get(deferredRetryAfter)
			if ra == "" {
				ra = se.Header.Get("Retry-After")
			}
			if d, ok := parseRetryAfter(ra, time.Now()); ok {
				e.RetryAfter = d
			}
		}
		switch {
		case se.StatusCode == http.StatusGatewayTimeout && mutation:
			return fmt.Errorf("%w: %w", ErrUnknownOutcome, e)
		case se.StatusCode == http.StatusNotFound:
			return fmt.Errorf("%w: %w", ErrNotFound, e)
		}
		return e
	}
	if mutation && !notSent(err) {
		return fmt.Errorf("%w: %w", ErrUnknownOutcome, err)
	}
	return err
}

// notSent reports whether err is a failure to connect (refused, no
// route, DNS): the request never reached MAAS, so it was not applied.
func notSent(err error) bool {
	var oe *net.OpError
	return errors.As(err, &oe) && oe.Op == "dial"
}

// redact replaces the API key's token and secret in s.
func (c *Client) redact(s string) string {
	parts := strings.Split(c.cfg.APIKey, ":")
	for _, p := range parts[1:] {
		if len(p) >= 8 {
			s = strings.ReplaceAll(s, p, "[redacted]")
		}
	}
	return s
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
