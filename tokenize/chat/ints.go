package chat

import (
	"errors"
	"fmt"
	"math"
	"math/big"
	"math/bits"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Python's int is arbitrary-precision. A template int is an int64 while
// it fits and a *big.Int beyond (never a *big.Int that fits an int64, so
// each integer has one form and the int64 path stays the common one). A
// *big.Int is never changed once it is a value: every operation makes a
// new one, as values are shared between renders (the message cache).
//
// Python refuses to convert an int of more than 4300 decimal digits to or
// from text (sys.get_int_max_str_digits()); this renderer keeps every int
// within that limit, so printing never fails. Python itself only refuses
// such an int when it is printed or parsed, not when it is computed: a
// template computing one fails here where Python might not, if it never
// printed it.

const maxIntDigits = 4300

// safeIntBits is the most bits an int can have and surely be below
// 10^4300 (2^14283 < 10^4300).
const safeIntBits = 14283

var intDigitLimit = new(big.Int).Exp(big.NewInt(10), big.NewInt(maxIntDigits), nil)

func errIntTooLarge() error {
	return fmt.Errorf("ValueError: Exceeds the limit (%d digits) for integer string conversion", maxIntDigits)
}

// normInt is z as a template value: an int64 when it fits.
func normInt(z *big.Int) (Value, error) {
	if z.IsInt64() {
		return z.Int64(), nil
	}
	if z.BitLen() > safeIntBits && z.CmpAbs(intDigitLimit) >= 0 {
		return nil, errIntTooLarge()
	}
	return z, nil
}

// intOf splits an int (bool included, as Python's bool is an int) into
// its int64 form or its *big.Int form (z != nil).
func intOf(v Value) (small int64, z *big.Int, ok bool) {
	switch v := v.(type) {
	case int64:
		return v, nil, true
	case bool:
		return boolInt(v), nil, true
	case *big.Int:
		return 0, v, true
	}
	return 0, nil, false
}

// isInt is Python's isinstance(v, int) and not bool.
func isInt(v Value) bool {
	switch v.(type) {
	case int64, *big.Int:
		return true
	}
	return false
}

// bigOf is an int as a *big.Int, to read only.
func bigOf(small int64, z *big.Int) *big.Int {
	if z != nil {
		return z
	}
	return big.NewInt(small)
}

// floatOf is float(v) for a number: ints round to the nearest float, and
// one too large for a float is Python's OverflowError.
func floatOf(v Value) (float64, bool, error) {
	switch v := v.(type) {
	case float64:
		return v, true, nil
	case int64:
		return float64(v), true, nil
	case bool:
		return float64(boolInt(v)), true, nil
	case *big.Int:
		f, _ := new(big.Float).SetInt(v).Float64()
		if math.IsInf(f, 0) {
			return 0, true, errors.New("OverflowError: int too large to convert to float")
		}
		return f, true, nil
	}
	return 0, false, nil
}

func isNumber(v Value) bool {
	switch v.(type) {
	case int64, float64, bool, *big.Int:
		return true
	}
	return false
}

// intBinop applies an arithmetic operator to two ints; ok is false when
// an operand is not an int or the operator is not arithmetic.
func intBinop(op string, l, r Value) (v Value, ok bool, err error) {
	a, ab, ok1 := intOf(l)
	b, bb, ok2 := intOf(r)
	if !ok1 || !ok2 {
		return nil, false, nil
	}
	if ab == nil && bb == nil {
		if v, done, err := int64Binop(op, a, b); done {
			return v, true, err
		}
	}
	x, y := bigOf(a, ab), bigOf(b, bb)
	z := new(big.Int)
	switch op {
	case "+":
		z.Add(x, y)
	case "-":
		z.Sub(x, y)
	case "*":
		z.Mul(x, y)
	case "//", "%":
		if y.Sign() == 0 {
			return nil, true, errors.New("ZeroDivisionError: integer division or modulo by zero")
		}
		q, m := new(big.Int).QuoRem(x, y, new(big.Int))
		if m.Sign() != 0 && (m.Sign() < 0) != (y.Sign() < 0) {
			q.Sub(q, big.NewInt(1))
			m.Add(m, y)
		}
		if op == "//" {
			z = q
		} else {
			z = m
		}
	case "/":
		if y.Sign() == 0 {
			return nil, true, errors.New("ZeroDivisionError: division by zero")
		}
		// Python's int / int is correctly rounded, not float(x) / float(y).
		f, _ := new(big.Rat).SetFrac(x, y).Float64()
		if math.IsInf(f, 0) {
			return nil, true, errors.New("OverflowError: integer division result too large for a float")
		}
		return f, true, nil
	case "**":
		v, err := intPow(x, y)
		return v, true, err
	default:
		return nil, false, nil
	}
	v, err = normInt(z)
	return v, true, err
}

// int64Binop is intBinop's fast path; done is false when the result does
// not fit an int64 (or the operator needs the general path).
func int64Binop(op string, a, b int64) (v Value, done bool, err error) {
	switch op {
	case "+":
		if c := a + b; (a^c)&(b^c) >= 0 {
			return c, true, nil
		}
	case "-":
		if c := a - b; (a^b)&(a^c) >= 0 {
			return c, true, nil
		}
	case "*":
		if c, ok := mul64(a, b); ok {
			return c, true, nil
		}
	case "//", "%":
		if b == 0 {
			return nil, true, errors.New("ZeroDivisionError: integer division or modulo by zero")
		}
		if a == math.MinInt64 && b == -1 {
			if op == "%" {
				return int64(0), true, nil
			}
			return nil, false, nil // -MinInt64 does not fit
		}
		q, m := a/b, a%b
		if m != 0 && (m < 0) != (b < 0) {
			q--
			m += b
		}
		if op == "//" {
			return q, true, nil
		}
		return m, true, nil
	case "/":
		const exact = 1 << 53 // both convert to float64 exactly
		if b != 0 && -exact <= a && a <= exact && -exact <= b && b <= exact {
			return float64(a) / float64(b), true, nil
		}
	case "**":
		if b < 0 {
			return nil, false, nil
		}
		res := int64(1)
		base := a
		for e := b; ; {
			if e&1 == 1 {
				var ok bool
				if res, ok = mul64(res, base); !ok {
					return nil, false, nil
				}
			}
			if e >>= 1; e == 0 {
				return res, true, nil
			}
			var ok bool
			if base, ok = mul64(base, base); !ok {
				return nil, false, nil
			}
		}
	}
	return nil, false, nil
}

func mul64(a, b int64) (int64, bool) {
	if a == int64(int32(a)) && b == int64(int32(b)) {
		return a * b, true
	}
	neg := (a < 0) != (b < 0)
	ua, ub := uint64(a), uint64(b)
	if a < 0 {
		ua = -ua
	}
	if b < 0 {
		ub = -ub
	}
	hi, lo := bits.Mul64(ua, ub)
	switch {
	case hi != 0:
		return 0, false
	case !neg && lo <= math.MaxInt64:
		return int64(lo), true
	case neg && lo <= 1<<63:
		return int64(-lo), true
	}
	return 0, false
}

// intPow is x ** y for ints: exact for y >= 0, a float for y < 0, as in
// Python.
func intPow(x, y *big.Int) (Value, error) {
	if y.Sign() < 0 {
		fx, _, err := floatOf(x)
		if err != nil {
			return nil, err
		}
		fy, _, err := floatOf(y)
		if err != nil {
			return nil, err
		}
		return floatPow(fx, fy)
	}
	switch {
	case x.Sign() == 0 || x.CmpAbs(big.NewInt(1)) == 0:
		// 0, 1 and -1 stay small whatever the exponent.
		if x.Sign() < 0 && y.Bit(0) == 0 {
			return int64(1), nil
		}
		if y.Sign() == 0 {
			return int64(1), nil
		}
		return x.Int64(), nil
	case !y.IsInt64() || y.Int64() > (safeIntBits+64)/int64(x.BitLen()-1):
		return nil, errIntTooLarge()
	}
	return normInt(new(big.Int).Exp(x, y, nil))
}

// floatPow is Python's float ** float, short of complex results.
func floatPow(a, b float64) (Value, error) {
	if a == 0 && b < 0 {
		return nil, errors.New("ZeroDivisionError: 0.0 cannot be raised to a negative power")
	}
	p := math.Pow(a, b)
	if math.IsInf(p, 0) && !math.IsInf(a, 0) && !math.IsInf(b, 0) {
		return nil, errors.New("OverflowError: (34, 'Numerical result out of range')")
	}
	return p, nil
}

// floatFloorDivMod is CPython's _float_div_mod: floor division and modulo
// of floats, with their signs of zero.
func floatFloorDivMod(vx, wx float64) (floordiv, mod float64) {
	mod = math.Mod(vx, wx)
	div := (vx - mod) / wx
	if mod != 0 {
		if (wx < 0) != (mod < 0) {
			mod += wx
			div -= 1.0
		}
	} else {
		mod = math.Copysign(0, wx)
	}
	if div != 0 {
		floordiv = math.Floor(div)
		if div-floordiv > 0.5 {
			floordiv += 1.0
		}
	} else {
		floordiv = math.Copysign(0, vx/wx)
	}
	return floordiv, mod
}

// numCompare orders two numbers exactly, as Python does (an int and a
// float compare by value, not after rounding the int to a float).
// unordered is true when a NaN is involved; ok is false when either is
// not a number.
func numCompare(l, r Value) (c int, unordered, ok bool) {
	a, ab, aInt := intOf(l)
	b, bb, bInt := intOf(r)
	switch {
	case aInt && bInt:
		if ab == nil && bb == nil {
			return cmp64(a, b), false, true
		}
		return bigOf(a, ab).Cmp(bigOf(b, bb)), false, true
	case aInt:
		f, isFloat := r.(float64)
		if !isFloat {
			return 0, false, false
		}
		c, unordered := cmpIntFloat(a, ab, f)
		return c, unordered, true
	case bInt:
		f, isFloat := l.(float64)
		if !isFloat {
			return 0, false, false
		}
		c, unordered := cmpIntFloat(b, bb, f)
		return -c, unordered, true
	}
	x, ok1 := l.(float64)
	y, ok2 := r.(float64)
	if !ok1 || !ok2 {
		return 0, false, false
	}
	switch {
	case x < y:
		return -1, false, true
	case x > y:
		return 1, false, true
	case x == y:
		return 0, false, true
	}
	return 0, true, true
}

func cmp64(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func cmpIntFloat(a int64, ab *big.Int, f float64) (int, bool) {
	switch {
	case math.IsNaN(f):
		return 0, true
	case math.IsInf(f, 1):
		return -1, false
	case math.IsInf(f, -1):
		return 1, false
	}
	const exact = 1 << 53
	if ab == nil && -exact <= a && a <= exact {
		x := float64(a)
		switch {
		case x < f:
			return -1, false
		case x > f:
			return 1, false
		}
		return 0, false
	}
	// big.Float holds both exactly.
	return new(big.Float).SetInt(bigOf(a, ab)).Cmp(big.NewFloat(f)), false
}

// floatToInt is int(f): truncation, exact however large.
func floatToInt(f float64) (Value, error) {
	switch {
	case math.IsInf(f, 0):
		return nil, errors.New("OverflowError: cannot convert float infinity to integer")
	case math.IsNaN(f):
		return nil, errors.New("ValueError: cannot convert float NaN to integer")
	case -9.2e18 < f && f < 9.2e18:
		return int64(f), nil
	}
	z, _ := new(big.Float).SetFloat64(math.Trunc(f)).Int(nil)
	return normInt(z)
}

// intNeg is -v for an int.
func intNeg(small int64, z *big.Int) (Value, error) {
	if z == nil && small != math.MinInt64 {
		return -small, nil
	}
	return normInt(new(big.Int).Neg(bigOf(small, z)))
}

// isNumberSpace is the white space int() and float() ignore around a
// number: CPython maps non-ASCII white space to ' ' and then skips C's
// ASCII white space, so U+001C..U+001F, white space for str.isspace(),
// are not white space here. That is exactly Go's unicode.IsSpace.
func isNumberSpace(r rune) bool { return unicode.IsSpace(r) }

// pyIntString is int(s, base) for a str: white space around, an
// optional sign, digits of the base (any Unicode decimal digit counts),
// single underscores between digits, a 0x/0o/0b prefix allowed for its
// base and required in base 0 (where other leading zeros are an error).
func pyIntString(s string, base int64) (Value, bool) {
	if base != 0 && (base < 2 || base > 36) {
		return nil, false
	}
	s = strings.TrimFunc(s, isNumberSpace)
	neg := false
	if s != "" && (s[0] == '+' || s[0] == '-') {
		neg = s[0] == '-'
		s = s[1:]
	}
	if len(s) >= 2 && s[0] == '0' {
		var b int64
		switch s[1] | 0x20 {
		case 'x':
			b = 16
		case 'o':
			b = 8
		case 'b':
			b = 2
		}
		if b != 0 && (base == 0 || base == b) {
			base = b
			s = s[2:]
			s = strings.TrimPrefix(s, "_") // one underscore may follow the prefix
		}
	}
	leadingZero := false
	if base == 0 {
		base = 10
		leadingZero = len(s) > 1 && s[0] == '0'
	}
	digits := make([]byte, 0, len(s))
	prevUnderscore := true // no leading underscore
	for _, r := range s {
		if r == '_' {
			if prevUnderscore {
				return nil, false
			}
			prevUnderscore = true
			continue
		}
		d := pyDigit(r)
		if d < 0 || int64(d) >= base {
			return nil, false
		}
		digits = append(digits, "0123456789abcdefghijklmnopqrstuvwxyz"[d])
		prevUnderscore = false
	}
	if len(digits) == 0 || prevUnderscore {
		return nil, false
	}
	if leadingZero && strings.Trim(string(digits), "0") != "" {
		return nil, false // int("010", 0)
	}
	if base&(base-1) != 0 && len(digits) > maxIntDigits {
		return nil, false
	}
	z, ok := new(big.Int).SetString(string(digits), int(base))
	if !ok {
		return nil, false
	}
	if neg {
		z.Neg(z)
	}
	v, err := normInt(z)
	return v, err == nil
}

// pyDigit is the value of r as a digit of base up to 36: ASCII letters,
// and the decimal digits of every script (Python's int() reads "١٢"
// as 12).
func pyDigit(r rune) int {
	switch {
	case r >= '0' && r <= '9':
		return int(r - '0')
	case r >= 'a' && r <= 'z':
		return int(r-'a') + 10
	case r >= 'A' && r <= 'Z':
		return int(r-'A') + 10
	case r < utf8.RuneSelf || !unicode.IsDigit(r):
		return -1
	}
	// Unicode encodes each script's decimal digits as runs of ten from
	// zero, some runs back to back: the value is the offset into the run.
	start := r
	for unicode.IsDigit(start - 1) {
		start--
	}
	return int(r-start) % 10
}

// pyFloatString is float(s) for a str: white space around, an
// optional sign, decimal digits with single underscores between them, a
// fraction and an exponent, or inf/infinity/nan in any case.
func pyFloatString(s string) (float64, bool) {
	s = strings.TrimFunc(s, isNumberSpace)
	var b strings.Builder
	i := 0
	if i < len(s) && (s[i] == '+' || s[i] == '-') {
		b.WriteByte(s[i])
		i++
	}
	switch strings.ToLower(s[i:]) {
	case "inf", "infinity":
		return math.Inf(1 - 2*strings.Count(b.String(), "-")), true
	case "nan":
		return math.NaN(), true
	}
	rs := []rune(s[i:])
	j := 0
	digitPart := func() int {
		n := 0
		for j < len(rs) {
			if rs[j] == '_' && n > 0 && j+1 < len(rs) && pyDecimal(rs[j+1]) >= 0 {
				j++
				continue
			}
			d := pyDecimal(rs[j])
			if d < 0 {
				break
			}
			b.WriteByte(byte('0' + d))
			n++
			j++
		}
		return n
	}
	n := digitPart()
	if j < len(rs) && rs[j] == '.' {
		b.WriteByte('.')
		j++
		n += digitPart()
	}
	if n == 0 {
		return 0, false
	}
	if j < len(rs) && (rs[j] == 'e' || rs[j] == 'E') {
		b.WriteByte('e')
		j++
		if j < len(rs) && (rs[j] == '+' || rs[j] == '-') {
			b.WriteRune(rs[j])
			j++
		}
		if digitPart() == 0 {
			return 0, false
		}
	}
	if j != len(rs) {
		return 0, false
	}
	f, err := parseFloatLiteral(b.String())
	return f, err == nil
}

// pyDecimal is the value of a decimal digit of any script, or -1.
func pyDecimal(r rune) int {
	switch {
	case r >= '0' && r <= '9':
		return int(r - '0')
	case r < utf8.RuneSelf || !unicode.IsDigit(r):
		return -1
	}
	return pyDigit(r)
}

// parseFloatLiteral reads a checked decimal literal; out of range is an
// infinity (or zero), as Python's float() gives, not an error.
func parseFloatLiteral(s string) (float64, error) {
	f, err := strconv.ParseFloat(s, 64)
	if errors.Is(err, strconv.ErrRange) {
		return f, nil
	}
	return f, err
}

// pyRoundInt is round(v, ndigits) for an int: itself for ndigits >= 0,
// else rounded half to even to a multiple of 10^-ndigits.
func pyRoundInt(small int64, z *big.Int, ndigits int64) (Value, error) {
	if ndigits >= 0 {
		if z != nil {
			return z, nil
		}
		return small, nil
	}
	if ndigits < -maxIntDigits {
		return int64(0), nil
	}
	x := bigOf(small, z)
	p := new(big.Int).Exp(big.NewInt(10), big.NewInt(-ndigits), nil)
	q, m := new(big.Int).DivMod(x, p, new(big.Int)) // m >= 0: floor division
	switch c := new(big.Int).Lsh(m, 1).Cmp(p); {
	case c > 0, c == 0 && q.Bit(0) == 1:
		q.Add(q, big.NewInt(1))
	}
	return normInt(q.Mul(q, p))
}
