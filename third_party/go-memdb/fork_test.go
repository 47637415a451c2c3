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

// TestReadInPlace: a ReadInPlace write transaction's iterators and
// prefix reads see its own writes as they are, without a clone, readers
// and snapshots stay isolated, an iterator used after a write panics,
// and DeletePrefix (which deletes while it iterates) still works.
func TestReadInPlace(t *testing.T) {
	db := testDB(t)
	before := db.Txn(false)
	txn := db.Txn(true)
	txn.ReadInPlace()
	for i := 0; i < 2000; i++ {
		id := fmt.Sprintf("id-%04d", i)
		if err := txn.Insert("main", &TestObject{ID: id, Foo: fmt.Sprintf("f%d", i%7), Qux: []string{"q"}}); err != nil {
			t.Fatal(err)
		}
		if i%100 != 0 {
			continue
		}
		// A full iteration sees every write so far, in order.
		it, err := txn.Get("main", "id")
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for o := it.Next(); o != nil; o = it.Next() {
			if want := fmt.Sprintf("id-%04d", n); o.(*TestObject).ID != want {
				t.Fatalf("iteration %d: got %s, want %s", n, o.(*TestObject).ID, want)
			}
			n++
		}
		if n != i+1 {
			t.Fatalf("iterator saw %d objects, %d written", n, i+1)
		}
		// Prefix reads of a non-unique index: first and last.
		last, err := txn.Last("main", "foo", fmt.Sprintf("f%d", i%7))
		if err != nil || last.(*TestObject).ID != id {
			t.Fatalf("last of foo=f%d: %v %v", i%7, last, err)
		}
		first, err := txn.First("main", "id_prefix", "id-")
		if err != nil || first.(*TestObject).ID != "id-0000" {
			t.Fatalf("first of prefix id-: %v %v", first, err)
		}
	}

	it, err := txn.Get("main", "foo", "f1")
	if err != nil {
		t.Fatal(err)
	}
	it.Next()
	if err := txn.Insert("main", &TestObject{ID: "late", Foo: "f1", Qux: []string{"q"}}); err != nil {
		t.Fatal(err)
	}
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("an iterator used after a write of its ReadInPlace transaction did not panic")
			}
		}()
		it.Next()
	}()

	if ok, err := txn.DeletePrefix("main", "id_prefix", "id-00"); err != nil || !ok {
		t.Fatalf("DeletePrefix: %v %v", ok, err)
	}
	if got, _ := txn.First("main", "id_prefix", "id-00"); got != nil {
		t.Fatalf("DeletePrefix left %v", got)
	}
	if got, _ := txn.First("main", "id", "id-0100"); got == nil {
		t.Fatal("DeletePrefix deleted past its prefix")
	}
	if got, _ := before.First("main", "id", "id-0100"); got != nil {
		t.Fatalf("a read txn opened before saw an uncommitted write: %v", got)
	}
	snap := db.Snapshot()
	txn.Commit()
	if got, _ := snap.Txn(false).First("main", "id", "id-0100"); got != nil {
		t.Fatalf("a snapshot taken before the commit saw it: %v", got)
	}
	read := db.Txn(false)
	if got, _ := read.First("main", "id", "id-0100"); got == nil {
		t.Fatal("the commit is not visible")
	}
	// A read transaction ignores ReadInPlace.
	read.ReadInPlace()
	if _, err := read.Get("main", "id"); err != nil {
		t.Fatal(err)
	}
}

// appendField indexes one string field of *TestObject, as an
// AppendIndexer or (plain) as a SingleIndexer only; "" is missing.
type appendField struct {
	field func(*TestObject) string
}

func (f appendField) FromObject(raw interface{}) (bool, []byte, error) {
	return f.AppendFromObject(make([]byte, 0, 8), raw)
}

func (f appendField) AppendFromObject(b []byte, raw interface{}) (bool, []byte, error) {
	v := f.field(raw.(*TestObject))
	if v == "" {
		return false, nil, nil
	}
	return true, append(append(b, v...), 0), nil
}

func (f appendField) FromArgs(args ...interface{}) ([]byte, error) {
	return append([]byte(args[0].(string)), 0), nil
}

// plainField is appendField without AppendFromObject.
type plainField struct{ f appendField }

func (f plainField) FromObject(raw interface{}) (bool, []byte, error) { return f.f.FromObject(raw) }

func (f plainField) FromArgs(args ...interface{}) ([]byte, error) { return f.f.FromArgs(args...) }

// TestAppendIndexerWritesWhatFromObjectWrites: the same inserts,
// updates (keys kept, changed, made missing) and deletes through
// AppendIndexer indexes and through plain SingleIndexers leave the same
// rows in every index.
func TestAppendIndexerWritesWhatFromObjectWrites(t *testing.T) {
	schema := func(wrap func(appendField) Indexer) *DBSchema {
		return &DBSchema{Tables: map[string]*TableSchema{"main": {Name: "main", Indexes: map[string]*IndexSchema{
			"id":  {Name: "id", Unique: true, Indexer: wrap(appendField{func(o *TestObject) string { return o.ID }})},
			"foo": {Name: "foo", Indexer: wrap(appendField{func(o *TestObject) string { return o.Foo }})},
			"baz": {Name: "baz", Unique: true, AllowMissing: true, Indexer: wrap(appendField{func(o *TestObject) string { return o.Baz }})},
		}}}}
	}
	dbA, err := NewMemDB(schema(func(f appendField) Indexer { return f }))
	if err != nil {
		t.Fatal(err)
	}
	dbP, err := NewMemDB(schema(func(f appendField) Indexer { return plainField{f} }))
	if _, ok := Indexer(plainField{}).(AppendIndexer); ok {
		t.Fatal("plainField must not be an AppendIndexer")
	}
	if err != nil {
		t.Fatal(err)
	}
	dump := func(db *MemDB) string {
		txn := db.Txn(false)
		out := ""
		for _, idx := range []string{"id", "foo", "baz"} {
			it, err := txn.Get("main", idx)
			if err != nil {
				t.Fatal(err)
			}
			for o := it.Next(); o != nil; o = it.Next() {
				x := o.(*TestObject)
				out += fmt.Sprintf("%s:%s/%s/%s ", idx, x.ID, x.Foo, x.Baz)
			}
			out += "\n"
		}
		return out
	}
	for round := 0; round < 4; round++ {
		for _, db := range []*MemDB{dbA, dbP} {
			txn := db.Txn(true)
			txn.ReadInPlace()
			for i := 0; i < 300; i++ {
				o := &TestObject{ID: fmt.Sprintf("id-%03d", (i*7+round*13)%211), Foo: fmt.Sprintf("foo-%d", (i+round)%5)}
				if (i+round)%3 != 0 {
					o.Baz = fmt.Sprintf("baz-%d-%d", round, i) // unique when present
				}
				if err := txn.Insert("main", o); err != nil {
					t.Fatal(err)
				}
				if i%17 == 0 {
					if err := txn.Delete("main", &TestObject{ID: fmt.Sprintf("id-%03d", (i*5)%211)}); err != nil && err != ErrNotFound {
						t.Fatal(err)
					}
				}
			}
			txn.Commit()
		}
		a, p := dump(dbA), dump(dbP)
		if a != p {
			t.Fatalf("round %d: AppendIndexer rows differ from FromObject's:\n%s\nvs\n%s", round, a, p)
		}
		if a == "\n\n\n" {
			t.Fatal("nothing written")
		}
	}
}

// TestFirstKey: an exact lookup by encoded key finds what First finds,
// in a read transaction and in a write transaction's own writes; in a
// non-unique index the key ends with the primary key; an unknown table
// or index is an error.
func TestFirstKey(t *testing.T) {
	db := testDB(t)
	txn := db.Txn(true)
	for i := 0; i < 100; i++ {
		if err := txn.Insert("main", &TestObject{ID: fmt.Sprintf("id-%02d", i), Foo: "f", Qux: []string{"q"}}); err != nil {
			t.Fatal(err)
		}
	}
	key := func(id string) []byte { return append([]byte(id), 0) } // StringFieldIndex's encoding
	if o, err := txn.FirstKey("main", "id", key("id-42")); err != nil || o == nil || o.(*TestObject).ID != "id-42" {
		t.Fatalf("FirstKey in the writing transaction: %v %v", o, err)
	}
	txn.Commit()
	read := db.Txn(false)
	for _, id := range []string{"id-00", "id-99", "id-5", "nope"} {
		want, _ := read.First("main", "id", id)
		got, err := read.FirstKey("main", "id", key(id))
		if err != nil || got != want {
			t.Fatalf("FirstKey(%s) = %v, %v; First says %v", id, got, err, want)
		}
	}
	if o, err := read.FirstKey("main", "foo", key("f")); err != nil || o != nil {
		t.Fatalf("FirstKey on a non-unique index without the primary key: %v %v", o, err)
	}
	if o, err := read.FirstKey("main", "foo", append(key("f"), key("id-07")...)); err != nil || o == nil || o.(*TestObject).ID != "id-07" {
		t.Fatalf("FirstKey on a non-unique index with the primary key: %v %v", o, err)
	}
	if _, err := read.FirstKey("main", "nope", key("f")); err == nil {
		t.Fatal("FirstKey on an unknown index")
	}
	if _, err := read.FirstKey("nope", "id", key("f")); err == nil {
		t.Fatal("FirstKey on an unknown table")
	}
}
