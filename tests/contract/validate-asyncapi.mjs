// Parse an AsyncAPI document with the reference parser (@asyncapi/parser) and fail on any error.
//
//   node tests/contract/validate-asyncapi.mjs [path]     (default: schemas/asyncapi.yaml)
//
// Every diagnostic is printed as "<severity> <code> at <path>: <message>"; the exit code is 1 when
// one of them is an error or the parser returns no document, 2 when the file cannot be read.
import { readFileSync } from 'node:fs';
import { dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import parserPackage from '@asyncapi/parser';

const { Parser, DiagnosticSeverity } = parserPackage;
const root = resolve(dirname(fileURLToPath(import.meta.url)), '..', '..');
const file = resolve(process.argv[2] ?? resolve(root, 'schemas', 'asyncapi.yaml'));
const SEVERITY = { 0: 'error', 1: 'warning', 2: 'info', 3: 'hint' };

let source;
try {
  source = readFileSync(file, 'utf8');
} catch (error) {
  console.error(`cannot read ${file}: ${error.message}`);
  process.exit(2);
}

const { document, diagnostics } = await new Parser().parse(source, { source: file });
let errors = 0;
for (const d of diagnostics) {
  if (d.severity === DiagnosticSeverity.Error) errors += 1;
  const at = d.path && d.path.length ? d.path.join('.') : '<root>';
  console.log(`${SEVERITY[d.severity] ?? d.severity} ${d.code} at ${at}: ${d.message}`);
}
if (document === undefined || errors > 0) {
  console.log(`INVALID: ${file} (${errors} error(s))`);
  process.exit(1);
}
console.log(`VALID: ${file} (AsyncAPI ${document.version()}, ${document.channels().length} channels, `
  + `${document.operations().length} operations, ${document.messages().length} messages)`);
