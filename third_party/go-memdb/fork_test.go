package memdb

import (
	"fmt"
	"testing"
)

// TestExactLookupsInAWriteTxn: exact lookups read the write transaction's
// own index (no clone) and still see exactly its writes, interleaved with
// more writes and with iterators; readers and snapshots stay isolated.
func TestExactLookupsInAWriteTxn(t *testing.T) {
	db := testDB(t)
	before := db.Txn(false)
	txn := db.Txn(true)
	for i := 0; i < 3000; i++ {
		id := fmt.Sprintf("id-%04d", i)
		if err := txn.Insert("main", &TestObject{ID: id, Foo: "a", Qux: []string{"q"}}); err != nil {
			t.Fatal(err)
		}
		got, err := txn.First("main", "id", id)
		if err != nil || got == nil || got.(*TestObject).ID != id {
			t.Fatalf("lookup %s after its insert: %v %v", id, got, err)
		}
		if i%500 == 0 {
			// An iterator taken now does not see later writes.
			it, err := txn.Get("main", "id")
			if err != nil {
				t.Fatal(err)
			}
			if err := txn.Insert("main", &TestObject{ID: "zz-" + id, Foo: "b", Qux: []string{"q"}}); err != nil {
				t.Fatal(err)
			}
			n := 0
			for o := it.Next(); o != nil; o = it.Next() {
				if o.(*TestObject).ID == "zz-"+id {
					t.Fatalf("iterator saw a write made after it was taken")
				}
				n++
			}
			if n == 0 {
				t.Fatalf("empty iterator")
			}
		}
	}
	// Overwrite and delete, then look up again.
	if err := txn.Insert("main", &TestObject{ID: "id-0007", Foo: "c", Qux: []string{"q"}}); err != nil {
		t.Fatal(err)
	}
	if err := txn.Delete("main", &TestObject{ID: "id-0008", Foo: "a", Qux: []string{"q"}}); err != nil {
		t.Fatal(err)
	}
	if got, _ := txn.First("main", "id", "id-0007"); got.(*TestObject).Foo != "c" {
		t.Fatalf("overwrite not seen: %v", got)
	}
	if got, _ := txn.First("main", "id", "id-0008"); got != nil {
		t.Fatalf("delete not seen: %v", got)
	}
	if got, _ := before.First("main", "id", "id-0007"); got != nil {
		t.Fatalf("a read txn opened before saw an uncommitted write: %v", got)
	}
	txn.Commit()
	after := db.Txn(false)
	if got, _ := after.First("main", "id", "id-0007"); got == nil || got.(*TestObject).Foo != "c" {
		t.Fatalf("committed overwrite: %v", got)
	}
	if got, _ := before.First("main", "id", "id-0007"); got != nil {
		t.Fatalf("the old snapshot changed: %v", got)
	}
}
