package maas_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpuaas/gpuaas/coordinator/maas"
)

// fuzzKey is the API key of the fuzzed client; its secret must never show
// in an error.
const (
	fuzzKey    = "fuzzconsumer:fuzztoken:fuzzsecretfuzzsecret"
	fuzzSecret = "fuzzsecretfuzzsecret"
)

// replayTransport answers every request with one fuzzed response (a MAAS
// that may be broken or hostile) and records the paths the client asked
// for.
type replayTransport struct {
	status int
	body   []byte
	mu     sync.Mutex
	paths  []string
}

func (t *replayTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Body != nil {
		_, _ = io.Copy(io.Discard, r.Body)
		r.Body.Close()
	}
	t.mu.Lock()
	t.paths = append(t.paths, r.URL.EscapedPath())
	t.mu.Unlock()
	return &http.Response{StatusCode: t.status, Status: http.StatusText(t.status), Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: http.Header{"Content-Type": {"application/json"}}, Body: io.NopCloser(bytes.NewReader(t.body)),
		ContentLength: int64(len(t.body)), Request: r}, nil
}

// safeMAASPath is a path under the API whose segments are plain names:
// nothing a MAAS answer carries (a system_id, a boot resource ID) may
// steer a later request elsewhere ("..", "/", "?", "%2f").
var safeMAASPath = regexp.MustCompile(`^/MAAS/api/2\.0(/[A-Za-z0-9_][A-Za-z0-9_.:-]*)*/?$`)

// FuzzMAASResponses runs the client's reads against a MAAS whose answer
// (status and body) is fuzzed: never a panic, never the API key's secret
// in an error, and every request it makes afterwards (a machine named by
// the answer's system_id, a boot resource by its ID) stays a plain path
// under the API.
func FuzzMAASResponses(f *testing.F) {
	machine := `{"system_id":"abc123","hostname":"j22u15","status":4,"status_name":"Ready","power_state":"off","error_description":"","interface_set":[],"boot_interface":{"id":1,"mac_address":"52:54:00:00:00:01"},"tag_names":["gpuaas"]}`
	seeds := []struct {
		op     uint8
		status int
		body   string
	}{
		{0, 200, machine},
		{1, 200, "[" + machine + "]"},
		{1, 200, `[{"system_id":"../../users"}]`},
		{2, 200, "[" + machine + "," + machine + "]"},
		{3, 200, `{"abc123":{"power_address":"10.0.0.1"}}`},
		{3, 200, `{"../x":{"power_address":"10.0.0.1"}}`},
		{4, 200, `[{"id":1,"name":"nvme0n1","size":3840755982336,"serial":"S6EX","model":"SAMSUNG","id_path":"/dev/disk/by-id/nvme-x","partitions":[]}]`},
		{5, 200, `[{"id":1,"name":"eno1","mac_address":"52:54:00:00:00:01","links":[{"id":1,"mode":"static","ip_address":"10.10.0.5","subnet":{"id":1,"cidr":"10.10.0.0/24"}}]}]`},
		{6, 200, `{"state":"on"}`},
		{7, 200, `{"count":1,"events":[{"id":7,"level":"INFO","type":"Deploying","description":"x","created":"Thu, 21 Nov. 2026 19:00:00"}]}`},
		{8, 200, "[" + machine + "]"},
		{9, 200, `[{"id":1,"cidr":"10.10.0.0/24","name":"pxe"}]`},
		{10, 200, `[{"id":7,"name":"custom/lab","architecture":"amd64/generic","type":"Uploaded"}]`},
		{10, 200, `{"sets":{"20261121":{"files":{"root-tgz":{"filetype":"root-tgz"}}}}}`},
		{0, 404, `Not Found`},
		{0, 500, `{"detail":"fuzzsecretfuzzsecret"}`},
		{0, 200, `{"system_id":1}`},
		{0, 200, ``},
	}
	for _, s := range seeds {
		f.Add(s.op, s.status, []byte(s.body))
	}
	f.Fuzz(func(t *testing.T, op uint8, status int, body []byte) {
		if status < 100 || status > 599 {
			status = 200
		}
		tr := &replayTransport{status: status, body: body}
		c, err := maas.New(maas.Config{URL: "http://maas.invalid:5240/MAAS/", APIKey: fuzzKey, RequestTimeout: time.Second,
			PollInterval: time.Millisecond, Transport: tr})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		switch op % 11 {
		case 0:
			_, err = c.Machine(ctx, "abc123")
		case 1:
			_, err = c.Resolve(ctx, maas.Query{Hostname: "j22u15"})
		case 2:
			_, err = c.Resolve(ctx, maas.Query{MAC: "52:54:00:00:00:01"})
		case 3:
			_, err = c.Resolve(ctx, maas.Query{BMC: "10.0.0.1"})
		case 4:
			_, err = c.BlockDevices(ctx, "abc123")
		case 5:
			_, err = c.Interfaces(ctx, "abc123")
		case 6:
			_, err = c.PowerState(ctx, "abc123")
		case 7:
			_, err = c.Events(ctx, "abc123", "INFO", 3)
		case 8:
			_, err = c.MachinesInStatus(ctx, "ready")
		case 9:
			_, err = c.SubnetByCIDR(ctx, "10.10.0.0/24")
		case 10:
			_, err = c.BootResources(ctx)
		}
		if err != nil && strings.Contains(err.Error(), fuzzSecret) {
			t.Fatalf("the API key's secret is in an error: %v", err)
		}
		tr.mu.Lock()
		defer tr.mu.Unlock()
		for _, p := range tr.paths {
			if !safeMAASPath.MatchString(p) || strings.Contains(p, "/../") || strings.HasSuffix(p, "/..") || strings.Contains(p, "/./") {
				t.Fatalf("request path %q (after an answer %d %q) is not a plain path under the API", p, status, body)
			}
		}
	})
}
