#!/usr/bin/env node
// Validates AsyncAPI 3.x documents with @asyncapi/parser, the official parser: its default
// Spectral ruleset checks the document against the AsyncAPI JSON Schema of its version
// (including draft-07 payload/header schemas), resolves every $ref, and runs the
// asyncapi3-* consistency rules (operation messages belong to the operation's channel,
// channel parameters match the address, ...).
//
//   node tools/asyncapi-validate/validate.mjs FILE [FILE...]
//
// Every diagnostic is printed as
//   FILE[:LINE:COL] SEVERITY CODE at /json/pointer: message
// Exit status: 1 if any file cannot be read or parsed, is not AsyncAPI 3.x, or has a
// diagnostic of severity error; 0 otherwise (warnings/infos/hints are printed, not fatal).
//
// Checks added on top of the parser, for gaps it leaves in 3.x documents (its v2-only
// rules for schema formats and examples are not applied to 3.x); all are errors:
//   sagaworks-schema-format      a multi-format schema (`{schemaFormat, schema}`) whose
//                                schemaFormat has no registered schema parser: the parser
//                                skips such a schema silently, so a typo in schemaFormat
//                                would switch off all validation of it; and a draft-07
//                                (or AsyncAPI Schema) schema whose `$schema` names
//                                another JSON Schema draft;
//   sagaworks-headers-object     a message `headers` schema that is not `"type": "object"`
//                                (AsyncAPI 3.0: "Schema MUST be a map of key-value pairs");
//   sagaworks-channel-parameters an address with `{param}` expressions and no
//                                `parameters` object at all (the parser's rule only runs
//                                when `parameters` exists), or a parameter default that is
//                                not in its enum;
//   sagaworks-message-example    every message example's `payload` and `headers` must
//                                validate against the message's payload/headers schema
//                                (JSON Schema draft-07 via Ajv, formats included).
import { readFile } from 'node:fs/promises';
import path from 'node:path';
import { Parser, DiagnosticSeverity } from '@asyncapi/parser';
import Ajv from 'ajv';
import addFormats from 'ajv-formats';

const SEVERITY_NAMES = {
  [DiagnosticSeverity.Error]: 'error',
  [DiagnosticSeverity.Warning]: 'warning',
  [DiagnosticSeverity.Information]: 'info',
  [DiagnosticSeverity.Hint]: 'hint',
};

// Schema formats whose schemas are JSON Schema draft-07 (AsyncAPI Schema is a superset).
function isJsonSchemaFormat(format) {
  return (
    format === undefined ||
    /^application\/schema(\+json|\+yaml)?;version=draft-07$/.test(format) ||
    /^application\/vnd\.aai\.asyncapi(\+json|\+yaml)?;version=3\.\d+\.\d+$/.test(format)
  );
}

function usage() {
  process.stderr.write('usage: node validate.mjs FILE [FILE...]\n');
  process.exit(2);
}

function pointer(segments) {
  if (!Array.isArray(segments) || segments.length === 0) return '/';
  return '/' + segments.map((s) => String(s).replace(/~/g, '~0').replace(/\//g, '~1')).join('/');
}

function formatDiagnostic(file, d) {
  const name = SEVERITY_NAMES[d.severity] ?? `severity-${d.severity}`;
  const start = d.range?.start;
  const where = start ? `${file}:${start.line + 1}:${start.character + 1}` : file;
  // A diagnostic raised inside a $ref'd file names that file in `source`.
  const src = d.source && path.resolve(d.source) !== path.resolve(file) ? ` (in ${d.source})` : '';
  return `${where} ${name} ${d.code ?? '-'} at ${pointer(d.path)}${src}: ${d.message}`;
}

// Maps every object of the resolved document to the first JSON path it is reachable at,
// visiting `components` first so that a $ref'd definition is named by its own location.
function indexPaths(root) {
  const paths = new Map();
  const walk = (value, at) => {
    if (value === null || typeof value !== 'object' || paths.has(value)) return;
    paths.set(value, at);
    const keys = Object.keys(value);
    if (at.length === 0 && keys.includes('components')) {
      keys.splice(keys.indexOf('components'), 1);
      keys.unshift('components');
    }
    for (const k of keys) walk(value[k], [...at, Array.isArray(value) ? Number(k) : k]);
  };
  walk(root, []);
  return paths;
}

const DRAFT_07_META = /^https?:\/\/json-schema\.org\/draft-07\/schema#?$/;

// The schema inside a payload/headers slot, with its format: a multi-format schema object
// (`{schemaFormat, schema}`) or a plain Schema Object (AsyncAPI Schema by default).
function unwrapSchema(slot) {
  if (slot && typeof slot === 'object' && !Array.isArray(slot) && 'schemaFormat' in slot) {
    return { format: slot.schemaFormat, schema: slot.schema, multiFormat: true };
  }
  return { format: undefined, schema: slot, multiFormat: false };
}

// The parser inlines every $ref, so a recursive schema comes back as a cyclic object,
// which Ajv cannot compile. Copy it with each back-edge replaced by a local $ref to the
// copy of the ancestor; `$id`s are dropped so that these refs resolve against the root.
let acyclicCount = 0;
function toAcyclic(root) {
  const onPath = new Map();
  const copy = (value, at, parentKey) => {
    if (value === null || typeof value !== 'object') return value;
    if (onPath.has(value)) {
      const target = onPath.get(value);
      const fragment = target.map((seg) => '/' + encodeURIComponent(String(seg).replace(/~/g, '~0').replace(/\//g, '~1')));
      return { $ref: '#' + fragment.join('') };
    }
    onPath.set(value, at);
    let out;
    if (Array.isArray(value)) {
      out = value.map((v, i) => copy(v, [...at, i], i));
    } else {
      out = {};
      for (const [k, v] of Object.entries(value)) {
        if (k === '$id' && typeof v === 'string' && parentKey !== 'properties') continue;
        out[k] = copy(v, [...at, k], k);
      }
    }
    onPath.delete(value);
    return out;
  };
  const out = copy(root, [], undefined);
  // A root id, so that `#...` refs (even `#` itself) have a base to resolve against.
  if (out && typeof out === 'object' && !Array.isArray(out)) out.$id = `urn:sagaworks-asyncapi-validate:${++acyclicCount}`;
  return out;
}

// Additional checks (see the header comment). Returns Spectral-shaped diagnostics.
function extraChecks(parser, document, spectralDocument) {
  const results = [];
  const root = document.json();
  const paths = indexPaths(root);
  const rangeOf = (at) => {
    try {
      return spectralDocument?.getRangeForJsonPath(at, true);
    } catch {
      return undefined;
    }
  };
  const report = (code, at, message) =>
    results.push({ code, path: at, message, severity: DiagnosticSeverity.Error, range: rangeOf(at) });

  // Schema slots: message payload/headers and components.schemas.*, each once.
  const slots = [];
  const messages = document.allMessages().all().map((m) => m.json());
  for (const message of messages) {
    const at = paths.get(message);
    if (!at) continue;
    for (const part of ['payload', 'headers']) {
      if (message[part] !== undefined) slots.push({ at: [...at, part], part, slot: message[part] });
    }
  }
  for (const [name, slot] of Object.entries(root.components?.schemas ?? {})) {
    slots.push({ at: ['components', 'schemas', name], part: 'schema', slot });
  }
  const seen = new Set();
  const unusable = new Set(); // schemas already reported, not to be compiled for examples
  for (const { at, part, slot } of slots) {
    if (seen.has(slot)) continue;
    seen.add(slot);
    const { format, schema, multiFormat } = unwrapSchema(slot);
    // sagaworks-schema-format: an unknown schemaFormat switches validation off silently.
    if (multiFormat && (typeof format !== 'string' || !parser.parserRegistry.has(format))) {
      report(
        'sagaworks-schema-format',
        [...at, 'schemaFormat'],
        `schemaFormat ${JSON.stringify(format)} has no registered schema parser, so this schema would not be ` +
          'validated at all; use "application/schema+json;version=draft-07" or ' +
          '"application/vnd.aai.asyncapi+json;version=<asyncapi version>"',
      );
      continue;
    }
    if (!isJsonSchemaFormat(format) || schema === null || typeof schema !== 'object') continue;
    // sagaworks-schema-format: the format says draft-07 (or AsyncAPI Schema, a draft-07
    // superset) and the parser validated it as such, so a $schema naming another draft
    // would make other tools read the schema differently.
    if (typeof schema.$schema === 'string' && !DRAFT_07_META.test(schema.$schema)) {
      unusable.add(schema);
      const schemaAt = multiFormat ? [...at, 'schema', '$schema'] : [...at, '$schema'];
      report(
        'sagaworks-schema-format',
        schemaAt,
        `$schema ${JSON.stringify(schema.$schema)} contradicts the schema format ` +
          `${JSON.stringify(format ?? 'AsyncAPI Schema (default)')}, which is JSON Schema draft-07: use ` +
          '"http://json-schema.org/draft-07/schema#" or leave $schema out',
      );
    }
    // sagaworks-headers-object: "Schema MUST be a map of key-value pairs" (AsyncAPI 3.0,
    // Message Object `headers`); the parser does not check it.
    if (part === 'headers' && schema.type !== 'object') {
      report(
        'sagaworks-headers-object',
        multiFormat ? [...at, 'schema'] : at,
        `the headers schema must be an object schema ("type": "object"), got type ${JSON.stringify(schema.type)}`,
      );
    }
  }

  // sagaworks-channel-parameters: the parser's asyncapi3-channel-parameters rule only runs
  // when a channel has a `parameters` object, so an address expression with no
  // `parameters` at all passes; and nothing checks a parameter's default against its enum.
  const channelGroups = [
    [['channels'], root.channels],
    [['components', 'channels'], root.components?.channels],
  ];
  for (const [base, channels] of channelGroups) {
    for (const [id, channel] of Object.entries(channels ?? {})) {
      if (!channel || typeof channel !== 'object') continue;
      const at = [...base, id];
      const names = [...String(channel.address ?? '').matchAll(/{([^}]+)}/g)].map((m) => m[1]);
      if (names.length && (channel.parameters === undefined || channel.parameters === null)) {
        report(
          'sagaworks-channel-parameters',
          [...at, 'address'],
          `address ${JSON.stringify(channel.address)} uses parameter(s) ${names.join(', ')} but the channel ` +
            'has no "parameters" object',
        );
      }
      for (const [name, param] of Object.entries(channel.parameters ?? {})) {
        if (param && Array.isArray(param.enum) && 'default' in param && !param.enum.includes(param.default)) {
          report(
            'sagaworks-channel-parameters',
            [...at, 'parameters', name, 'default'],
            `default ${JSON.stringify(param.default)} is not one of the enum values ${JSON.stringify(param.enum)}`,
          );
        }
      }
    }
  }

  // sagaworks-message-example: examples against the payload and headers schemas.
  const ajv = new Ajv({ strict: false, allErrors: true, addUsedSchema: false, logger: false });
  addFormats(ajv);
  for (const message of messages) {
    const at = paths.get(message);
    const examples = Array.isArray(message.examples) ? message.examples : [];
    examples.forEach((example, i) => {
      for (const part of ['payload', 'headers']) {
        if (!example || !(part in example) || message[part] === undefined) continue;
        const { format, schema } = unwrapSchema(message[part]);
        if (!isJsonSchemaFormat(format) || schema === undefined || unusable.has(schema)) continue;
        let validateFn;
        try {
          validateFn = ajv.compile(toAcyclic(schema));
        } catch (err) {
          report('sagaworks-message-example', [...at, part], `cannot compile the ${part} schema to check examples: ${err.message}`);
          continue;
        }
        if (!validateFn(example[part])) {
          for (const e of validateFn.errors) {
            report(
              'sagaworks-message-example',
              [...at, 'examples', i, part, ...e.instancePath.split('/').slice(1)],
              `example ${JSON.stringify(example.name ?? i)} ${part}${e.instancePath} ${e.message}` +
                (e.params && Object.keys(e.params).length ? ` ${JSON.stringify(e.params)}` : ''),
            );
          }
        }
      }
    });
  }
  return results;
}

async function validateFile(parser, file) {
  let text;
  try {
    text = await readFile(file, 'utf8');
  } catch (err) {
    console.error(`${file}: cannot read: ${err.message}`);
    return false;
  }
  // The parser reads JSON and YAML. Fail early on broken JSON with a precise message
  // (the YAML reader would otherwise accept some malformed JSON as YAML).
  if (file.endsWith('.json')) {
    try {
      JSON.parse(text);
    } catch (err) {
      console.error(`${file}: not valid JSON: ${err.message}`);
      return false;
    }
  }

  // `source` (absolute) makes relative $refs resolve against the file's directory.
  const { document, diagnostics: parserDiagnostics, extras } = await parser.parse(text, {
    source: path.resolve(file),
  });

  let diagnostics = [...parserDiagnostics];
  if (document !== undefined) {
    diagnostics = diagnostics.concat(extraChecks(parser, document, extras?.document));
  }

  diagnostics.sort((a, b) => a.severity - b.severity || (a.range?.start?.line ?? 0) - (b.range?.start?.line ?? 0));
  for (const d of diagnostics) console.log(formatDiagnostic(file, d));

  const count = (sev) => diagnostics.filter((d) => d.severity === sev).length;
  const errors = count(DiagnosticSeverity.Error);
  const warnings = count(DiagnosticSeverity.Warning);
  const others = diagnostics.length - errors - warnings;
  const tally = `${errors} error(s), ${warnings} warning(s)` + (others ? `, ${others} info/hint(s)` : '');

  if (errors > 0 || document === undefined) {
    const why = errors > 0 ? tally : `the parser returned no document (${tally})`;
    console.error(`${file}: INVALID AsyncAPI document: ${why}`);
    return false;
  }

  const version = document.version();
  if (!/^3\./.test(version)) {
    console.error(`${file}: INVALID: AsyncAPI ${version}, this repository requires AsyncAPI 3.x`);
    return false;
  }
  const channels = document.allChannels().length;
  const messages = document.allMessages().length;
  const operations = document.allOperations().length;
  const suffix = diagnostics.length > 0 ? `; ${tally}` : '';
  console.log(
    `${file}: valid AsyncAPI ${version} (${channels} channels, ${messages} messages, ${operations} operations)${suffix}`,
  );
  return true;
}

async function main() {
  const files = process.argv.slice(2);
  if (files.length === 0 || files.includes('-h') || files.includes('--help')) usage();
  const parser = new Parser();
  let ok = true;
  for (const file of files) {
    try {
      if (!(await validateFile(parser, file))) ok = false;
    } catch (err) {
      console.error(`${file}: validator crashed: ${err?.stack ?? err}`);
      ok = false;
    }
  }
  process.exit(ok ? 0 : 1);
}

await main();
