package enroll

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"

	"github.com/gpuaas/gpuaas/proto"
)

// FuzzCARotationCommands decodes fuzzed Raft command bodies of the CA
// rotation (72-74) and the audit export watermark (66) and applies them to
// a table in the middle of a rotation: no panic, a refused command changes
// nothing, and the table keeps at most one staged and exactly one active
// CA, with no key on a retired one.
func FuzzCARotationCommands(f *testing.F) {
	cert := "-----BEGIN CERTIFICATE-----\nx\n-----END CERTIFICATE-----\n"
	key := "-----BEGIN EC PRIVATE KEY-----\nx\n-----END EC PRIVATE KEY-----\n"
	seed := func(op byte, v any) {
		b, _ := json.Marshal(v)
		f.Add(op, b)
	}
	seed(0, proto.CAIntroduceRequest{New: proto.CARecord{ID: "00000000000000c3", CertPEM: cert, KeyPEM: key}})
	seed(1, proto.CAActivateRequest{ID: "00000000000000b2"})
	seed(2, proto.CARetireRequest{ID: "00000000000000a1"})
	seed(2, proto.CARetireRequest{ID: "00000000000000b2"})
	seed(3, proto.AuditExportAck{Seq: 7, Hash: "ab"})
	f.Add(byte(1), []byte(`{"id":`))
	f.Fuzz(func(t *testing.T, op byte, body []byte) {
		tab := New()
		at := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
		if err := tab.IntroduceCA(proto.CAIntroduceRequest{At: at, Current: proto.CARecord{ID: "00000000000000a1", CertPEM: cert},
			New: proto.CARecord{ID: "00000000000000b2", CertPEM: cert, KeyPEM: key}}); err != nil {
			t.Fatal(err)
		}
		before, _ := tab.MarshalJSON()
		var err error
		switch op % 4 {
		case 0:
			var r proto.CAIntroduceRequest
			if json.Unmarshal(body, &r) != nil {
				return
			}
			err = tab.IntroduceCA(r)
		case 1:
			var r proto.CAActivateRequest
			if json.Unmarshal(body, &r) != nil {
				return
			}
			err = tab.ActivateCA(r)
		case 2:
			var r proto.CARetireRequest
			if json.Unmarshal(body, &r) != nil {
				return
			}
			err = tab.RetireCA(r)
		case 3:
			var r proto.AuditExportAck
			if json.Unmarshal(body, &r) != nil {
				return
			}
			err = tab.AckAuditExport(r)
		}
		after, _ := tab.MarshalJSON()
		if err != nil && !bytes.Equal(before, after) {
			t.Fatalf("a refused command changed the table: %v", err)
		}
		staged, active := 0, 0
		for _, c := range tab.CAs() {
			switch c.State {
			case proto.CAStaged:
				staged++
			case proto.CAActive:
				active++
			case proto.CARetired:
				if c.KeyPEM != "" {
					t.Fatalf("retired CA %s keeps its key", c.ID)
				}
			}
		}
		if staged > 1 || active != 1 {
			t.Fatalf("%d staged and %d active CAs", staged, active)
		}
		restored := New()
		if err := restored.Restore(after); err != nil {
			t.Fatalf("the table does not restore: %v", err)
		}
	})
}
