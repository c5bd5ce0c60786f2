package keyspace

import "testing"

// TestTokenCodec: epoch 0 is the create revision itself; a token splits
// back into its epoch and revision; every token of an epoch is above every
// token of the epochs before it.
func TestTokenCodec(t *testing.T) {
	const maxRev = 1<<EpochShift - 1
	for _, tc := range []struct{ epoch, rev int64 }{{0, 1}, {0, 12345}, {0, maxRev}, {1, 1}, {7, 99}, {MaxEpoch, maxRev}} {
		tok := TokenOf(tc.epoch, tc.rev)
		if !TokenFits(tc.epoch, tc.rev) || tok <= 0 {
			t.Fatalf("TokenOf(%d, %d) = %d", tc.epoch, tc.rev, tok)
		}
		if e, r := SplitToken(tok); e != tc.epoch || r != tc.rev {
			t.Fatalf("SplitToken(%d) = %d, %d; want %d, %d", tok, e, r, tc.epoch, tc.rev)
		}
		if tc.epoch == 0 && tok != tc.rev {
			t.Fatalf("epoch 0: token %d, want the create revision %d", tok, tc.rev)
		}
		if tok < EpochFloor(tc.epoch) || (tc.epoch < MaxEpoch && tok >= EpochFloor(tc.epoch+1)) {
			t.Fatalf("token %d outside its epoch's range", tok)
		}
	}
	if TokenFits(0, 0) || TokenFits(0, maxRev+1) || TokenFits(-1, 1) || TokenFits(MaxEpoch+1, 1) {
		t.Fatal("TokenFits accepted a revision or an epoch a token cannot carry")
	}
}
