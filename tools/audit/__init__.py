"""The auditor's and the analyst's offline reads of a chain file.

None of them asks a running node: each reads the chain file (a copy will do)
and verifies it in the same pass. :mod:`.chain_group` is ``infervisor chain``
(verify: :mod:`.chain_verify`; prove and consistency: :mod:`.chain_proofs`;
checkpoint, backup and rotate-key: :mod:`.chain_files`; export and
verify-bundle: :mod:`.chain_bundle`; what they read: :mod:`.chain_inputs`);
:mod:`.replay`, :mod:`.timeline`, :mod:`.events` and :mod:`.report`
(``infervisor audit``) replay it; :mod:`.offline` is the verified read they
share, with ``--unverified`` marking.
"""
