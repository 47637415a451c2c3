package api

import (
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/gpuaas/gpuaas/coordinator/metrics"
)

// MetricsBackend is the part of a Backend that owns the replica's metrics
// (*server.Server implements it). For a backend without it the API keeps
// metrics of its own (API latency and long-polls only).
type MetricsBackend interface {
	Metrics() *metrics.Metrics
}

func metricsOf(b Backend) *metrics.Metrics {
	if mb, ok := b.(MetricsBackend); ok && mb.Metrics() != nil {
		return mb.Metrics()
	}
	return metrics.New()
}

// instrument observes each request of one route: its duration under the
// route's pattern (never the raw path, which would be a label per object)
// and its status code.
func (a *API) instrument(method, pattern string, h http.Handler) http.Handler {
	observe := a.metrics.APIObserver(method, pattern)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		sw, ok := w.(*statusWriter) // serve's, when the request came through it
		if !ok {
			sw = &statusWriter{ResponseWriter: w}
		}
		defer func() {
			status := sw.status
			if status == 0 {
				status = http.StatusOK // nothing written: net/http answers 200
			}
			observe(status, time.Since(start))
		}()
		h.ServeHTTP(sw, r)
	})
}

// getMetrics serves the replica's registry in the Prometheus exposition
// format (content negotiation and gzip by promhttp).
func (a *API) getMetrics(c *call) error {
	if _, err := c.query(); err != nil {
		return err
	}
	a.metricsHTTP.ServeHTTP(c.w, c.r)
	return nil
}

func (a *API) newMetricsHandler() http.Handler {
	reg := a.metrics.Registry()
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError, EnableOpenMetrics: true})
}
