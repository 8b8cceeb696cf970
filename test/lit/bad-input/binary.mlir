// RUN: %python -c "open('%t.bin', 'wb').write(b'\x7fELF\x02\x01\x01\x00\x00\x00')"
// RUN: not %opt %t.bin 2>&1 | FileCheck %s --check-prefix=NUL
// RUN: %python -c "open('%t.latin1', 'wb').write(b'func.func @f() {\n  return\n}\n// caf\xe9\n')"
// RUN: not %opt %t.latin1 2>&1 | FileCheck %s --check-prefix=UTF8
// RUN: %python -c "open('%t.junk', 'wb').write(b'\x13\x37 garbage {{{ ]]')"
// RUN: not %opt %t.junk 2>&1 | FileCheck %s --check-prefix=JUNK

// NUL: binary.mlir.tmp.bin:1:1: error: input contains NUL bytes (binary data?)
// UTF8: binary.mlir.tmp.latin1:4:7: error: input is not UTF-8 text nor MLIR bytecode (byte 0xe9)
// JUNK: binary.mlir.tmp.junk:1:1: error: {{.+}}
// JUNK-NOT: Traceback
