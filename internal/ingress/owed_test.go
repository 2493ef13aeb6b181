package ingress

import "testing"

// The owed charges are bounded (maxOwed; a further one is refused), taken payBatch at a time
// by one payer, and the ones a payment could not make go back in front, in order.
func TestOwedChargesBound(t *testing.T) {
	var o owedCharges
	for i := range maxOwed {
		if !o.keep(owedCharge{used: int64(i)}) {
			t.Fatalf("charge %d refused below the bound", i)
		}
	}
	if o.keep(owedCharge{used: -1}) {
		t.Fatalf("charge %d kept beyond the bound of %d", maxOwed+1, maxOwed)
	}
	batch := o.take()
	if len(batch) != payBatch || batch[0].used != 0 || o.len() != maxOwed-payBatch {
		t.Fatalf("took %d (first %d), %d left; want %d, 0, %d", len(batch), batch[0].used, o.len(), payBatch, maxOwed-payBatch)
	}
	if o.take() != nil {
		t.Fatal("a second payer took charges while the first was paying")
	}
	o.done(batch[10:]) // 10 made, the rest failed
	if got := o.len(); got != maxOwed-10 {
		t.Fatalf("%d kept after the payment, want %d", got, maxOwed-10)
	}
	if next := o.take(); next[0].used != 10 {
		t.Fatalf("the next payment starts at charge %d, want 10 (the first not made)", next[0].used)
	}
}
