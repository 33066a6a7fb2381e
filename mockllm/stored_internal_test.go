package mockllm

import (
	"strconv"
	"testing"
)

// ids lists a fifo's ids, oldest first.
func (f *fifo[T]) ids() []string {
	var out []string
	for e := f.order.Front(); e != nil; e = e.Next() {
		out = append(out, e.Value.(*fifoEntry[T]).id)
	}
	return out
}

// The store drops its oldest entries beyond its count and byte bounds,
// never the newest, and keeps its byte total in step with puts, growth and
// removals.
func TestFifoDropsOldest(t *testing.T) {
	f := fifo[int]{maxLen: 3, maxBytes: 100}
	for i := range 5 {
		f.put("k"+strconv.Itoa(i), i, 10)
	}
	if got := f.ids(); len(got) != 3 || got[0] != "k2" || got[2] != "k4" || f.bytes != 30 {
		t.Fatalf("by count: %v, %d bytes", got, f.bytes)
	}
	if _, ok := f.get("k1"); ok {
		t.Error("k1 still there")
	}
	if v, ok := f.get("k3"); !ok || v != 3 {
		t.Errorf("k3: %d %v", v, ok)
	}

	// Growing k4 past the byte bound drops the older ones first.
	f.grow("k4", 85)
	if got := f.ids(); len(got) != 1 || got[0] != "k4" || f.bytes != 95 {
		t.Fatalf("by bytes: %v, %d bytes", got, f.bytes)
	}
	// One entry over the bound on its own stays: the newest is never dropped.
	f.put("big", 9, 500)
	if got := f.ids(); len(got) != 1 || got[0] != "big" || f.bytes != 500 {
		t.Fatalf("oversized: %v, %d bytes", got, f.bytes)
	}
	// Replacing an id moves it to the newest place with its new size.
	f = fifo[int]{maxLen: 3, maxBytes: 100}
	f.put("a", 1, 10)
	f.put("b", 2, 10)
	f.put("a", 3, 20)
	if got := f.ids(); len(got) != 2 || got[0] != "b" || got[1] != "a" || f.bytes != 30 {
		t.Fatalf("replace: %v, %d bytes", got, f.bytes)
	}
	if !f.remove("b") || f.remove("b") || f.bytes != 20 {
		t.Errorf("remove: %v, %d bytes", f.ids(), f.bytes)
	}
}

// The server's stores keep at most storeCap responses: the oldest go.
func TestResponsesBounded(t *testing.T) {
	st := newState()
	for i := range storeCap + 5 {
		st.responses.put("resp_"+strconv.Itoa(i), &storedResponse{}, 1)
	}
	if n := st.responses.order.Len(); n != storeCap {
		t.Errorf("%d stored, want %d", n, storeCap)
	}
	if _, ok := st.responses.get("resp_4"); ok {
		t.Error("the oldest is still stored")
	}
	if _, ok := st.responses.get("resp_5"); !ok {
		t.Error("the oldest kept one is gone")
	}
}
