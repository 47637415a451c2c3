package proto

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func TestAppIngressRequest(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 11, 25, 0, 0, 0, 0, time.UTC)
	app := &App{Name: "jupyter", Compat: AppCompat{NeedsIngress: true},
		Ports: []AppPort{{Name: "ui", Port: 8888, Protocol: "http"}, {Name: "dns", Port: 53, Protocol: "udp"}, {Name: "ui2", Port: 8888, Protocol: "tcp"}}}
	req, ok := AppIngressRequest(app, "a1", at)
	assert.True(t, ok)
	assert.Equal(t, IngressAddRequest{At: at, AllocationID: "a1", App: "jupyter",
		Rules: []IngressRule{{Protocol: "tcp", Port: 8888}, {Protocol: "udp", Port: 53}}}, req)
	app.Compat.NeedsIngress = false
	_, ok = AppIngressRequest(app, "a1", at)
	assert.False(t, ok, "an app that needs no ingress asks for none")
}
